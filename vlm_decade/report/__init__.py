"""What both studies' reports are made of: `html` (the page, tables, CSVs) and `figures` (writing a
matplotlib figure into the run folder). Each study draws its own figures and sections
(`vlm_decade.studies.<study>.report`)."""
