"""Study reports: time to quality, the pay-off map and its time-matched frontier, replication."""
