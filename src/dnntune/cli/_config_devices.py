"""Which devices an override file was tuned on, as the commands that read or extend it say.

An entry records the device that tuned it (``autotune_metadata.device``, the name in its device
signature, e.g. ``NVIDIA H200``), but its match key names no device: a file tuned on an H200 is
read on a CPU, its engines are no candidates there, and every graph falls back to the static
order. ``dnntune run`` then says so in one line (:func:`other_device_note`), since each row's
``static`` alone does not tell a user that the file was for another machine.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from dnntune.backend.handle import Handle, create_handle
from dnntune.cli._output import plural
from dnntune.errors import ConfigFileError
from dnntune.overrides.file_cache import load_file_cached
from dnntune.settings import heur_config_path

__all__ = ["device_file_name", "other_device_note"]


def device_file_name(path: Path, device: str) -> str:
    """A file name beside ``path`` for entries of ``device``: ``overrides.json`` on
    ``AMD EPYC`` -> ``overrides_amd_epyc.json``."""
    slug = "".join(c if c.isalnum() else "_" for c in device.lower()).strip("_")
    return f"{path.stem}_{slug}.json"


def other_device_note(handle: Handle) -> str:
    """One line when the file ``DNNTUNE_HEUR_CONFIG_PATH`` names holds entries tuned on other
    devices and none, or only some, for ``handle``'s device: how many, on which devices, and
    what to do ("" when there is nothing to say: no variable, a file the Config policy already
    warns about, one whose entries are all for this device or name none).

    The caller says it only when no graph took its plan from the file: where one did, the
    file did its work, and which entries applied is in the table.
    """
    path = heur_config_path()
    here = handle.device_signature().get("name")
    if path is None or not here:
        return ""
    try:
        config = load_file_cached(path)  # as the Config policy reads it
    except ConfigFileError:  # the Config policy names the problem (one warning)
        return ""
    others = Counter({d: n for d, n in config.devices().items() if d != here})
    if not others:
        return ""
    mine = len(config.entries) - others.total()
    this = f"this device ({here}, {handle.device})"
    held = f"{path} holds {plural(len(config.entries), 'entry', 'entries')}"
    if len(others) == 1:
        tuned_on = next(iter(others))
    else:
        tuned_on = ", ".join(f"{d} ({n})" for d, n in others.most_common())
    if mine:
        head = f"{held}, only {mine} for {this}, the other {others.total()} tuned on {tuned_on}"
    else:
        head = f"{held}, none for {this}: all were tuned on {tuned_on}"
    tune = f"dnntune tune -g <graphs> -o {device_file_name(path, str(here))}"
    local = _local_devices()
    flags = [f"--device {local[d]}" for d in others if d in local]
    if flags:  # the device it was tuned on is on this machine too
        way_out = f"run with {' or '.join(flags)} to use them, or tune on this device ({tune})"
    else:
        way_out = f"tune on this device for entries of its own ({tune})"
    return f"{head}; none applied here: {way_out}"


def _local_devices() -> dict[str, str]:
    """The devices of this machine: name -> the ``--device`` that selects it."""
    import torch

    found = {str(create_handle("cpu").device_signature().get("name")): "cpu"}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            name = str(create_handle(f"cuda:{i}").device_signature().get("name"))
            found.setdefault(name, "cuda" if i == 0 else f"cuda:{i}")
    return found
