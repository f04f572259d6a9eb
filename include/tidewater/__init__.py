"""tidewater: a scheduled hybrid batch/stream data platform."""
