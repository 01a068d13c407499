"""Reference solutions to the exercises, same file names: read them after you have tried."""
