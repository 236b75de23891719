"""The configuration as the request path needs it: routes and their limits."""
