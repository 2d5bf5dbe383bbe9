"""The stages both studies share: `images` (checking the image files), `describe` (every model
answers every image variant and prompt) and `embed` (every distinct text, per encoder)."""
