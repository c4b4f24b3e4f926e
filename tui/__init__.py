"""eaglelab.tui: the Textual app. Reads events and run records only; imports no torch."""
