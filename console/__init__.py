"""fsd operator console: fsctl and the Textual app."""
