"""The process: the command line, the app's wiring and lifespan, workers and reload."""
