"""emulator/workloads package."""
