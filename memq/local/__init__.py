"""The local stack's launchers: a private redis-server (single or cluster), the supervised
children of `memq up` and `memq demo`, and the process supervision they share."""
