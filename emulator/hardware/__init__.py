"""emulator/hardware package."""
