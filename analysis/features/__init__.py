"""The analysis halves of the features built on the core measurement (adaptive, branched, recommend, schedule,
allocation, stop_behind): each folder reads the runs tables and the core fits, and the core does not import it."""
