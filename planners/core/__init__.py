"""The plan contract: events and results (`plan`), what a plan does to each
buffer over time (`semantics`), the static checker (`check`), plan files
(`io`), the planners' exception (`errors`) and their shared argument checks
(`jobs`)."""
