"""emulator/config package."""
