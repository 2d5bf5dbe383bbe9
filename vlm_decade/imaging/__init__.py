"""Images as the models see them: the masked variants (`masks`) and conversion to RGB."""
