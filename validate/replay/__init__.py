"""The replay executor: a trace run op by op with real tensors under a plan,
with the device and host pools, the copy lanes and the device clock."""
