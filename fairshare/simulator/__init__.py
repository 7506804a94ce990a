"""The simulator: scenarios and the openb trace replayed through the extender's core."""
