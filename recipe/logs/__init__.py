"""What a run writes and how it is read back: metrics, selection statistics, run records and logs, the
short debug run the golden losses record."""
