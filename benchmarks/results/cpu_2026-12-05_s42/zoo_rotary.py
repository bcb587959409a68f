import warnings; warnings.simplefilter("ignore")
import torch
from _real_models import zoo_entries, available
from dnntune.torch._rotary import rotary_modules
entries, _ = available(zoo_entries("transformers"))
for e in entries:
    m = e.build()
    print(f"{e.name}: {rotary_modules(m)}")
