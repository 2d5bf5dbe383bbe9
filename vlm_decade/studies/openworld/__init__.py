"""Study B: LMMs as open-world classifiers (METHOD.md): labelled images, free-text predictions,
four metrics (TI, LI, SS, CS), the error types their disagreement reveals, closed-world baselines."""
