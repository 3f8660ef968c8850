"""One module per `memplan` subcommand; each defines `register(subparsers)`."""
