"""Using a trained run: translating text, scoring a split, attention maps.

Modules: translator (a run's model, tokenizer, parameters and search, batched), evaluation
(sacreBLEU/chrF of a split and the copy baseline), attention_maps. They only read a workdir,
so they work on a run that is still training.
"""
