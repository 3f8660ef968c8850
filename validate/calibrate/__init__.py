"""Simulated against measured: measure the replay device as a DeviceModel,
simulate a plan with it, replay it, and report how close the two are."""
