"""eaglelab.probes: observe the engine, turn what it reports into events, records and verdicts."""
