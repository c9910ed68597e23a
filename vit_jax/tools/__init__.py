"""The commands besides training (`python -m vit_jax.tools.<name>`): predict, export, pictures,
fewshot, report, plan, vtab, scaling and to_array_record; each thin over the packages. introspection
is no command: the numbers pictures draws."""
