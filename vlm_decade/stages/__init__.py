"""The stages both studies share: `images` (checking the image files), `describe` (every model
answers every image variant and prompt), `embed` (every distinct text, per encoder), and `estimate`
(what the API stages would spend)."""
