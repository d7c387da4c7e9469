"""`bcrit schedule` (and the schedule line of `bcrit recommend`): the plan read from a sweep's analysis."""
