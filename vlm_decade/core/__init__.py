"""The spine every study runs on: config base types (`config`), the run folder (`runfolder`), stages
and the runner (`runner`), the one bounded loop for Ray work (`dispatch`), starting Ray
(`runtime`), progress, input problems (`errors`), reading the user's tables (`tables`), object
storage (`storage`), the registry mechanism (`registry`), and at the bottom, writing, hashing and
naming files (`files`)."""
