"""emulator/engine package."""
