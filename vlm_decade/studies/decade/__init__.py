"""Study A, a decade of VLMs against people (METHOD.md): its data (`data`, `ranking`), the stages
`score`, `statistics`, `metric_validation`, `stsb` and the error `taxonomy`, the `report`, and the
`pipeline` that runs them in order."""
