"""The core step: the engine (model + memory + sampling, one step at a time), the
planner that splits a step's token budget between sequences, the runner that turns a
plan into one forward, and the sequence each running choice is."""
