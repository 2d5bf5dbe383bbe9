"""Images as the models see them: one decoder for every file (`decode`: any mode Pillow reads, as
upright 8-bit RGB) and the masked variants (`masks`)."""
