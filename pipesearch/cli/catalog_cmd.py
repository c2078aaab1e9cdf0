"""``pipesearch catalog``: list and show catalog entries."""

from __future__ import annotations

import difflib
import json

import click
import pandas as pd

from ..catalog import list_entries, resolve
from ..errors import CatalogError
from ..hardware import describe_cluster, load_cluster, load_device
from ..units import format_bytes
from . import main


@main.group("catalog")
def catalog_group():
    """List and show the built-in models and hardware.

    \b
    Examples:
      pipesearch catalog models
      pipesearch catalog hardware
      pipesearch catalog show 2x8-a100-80gb
    """


@catalog_group.command("models")
def models_command():
    """List the catalog's models (profiles and transformer configs).

    \b
    Example:
      pipesearch catalog models
    """
    from ..models import load_model_source

    rows = []
    cluster = load_cluster("1x8-a100-80gb")
    for name, path in list_entries("model").items():
        src = load_model_source(name, cluster, tp=1, recompute="none")
        prof = src.variants[0].profile
        params = sum(lay.param_bytes for lay in prof.layers) / prof.bytes_per_param
        rows.append({"model": name, "kind": src.info["kind"], "layers": src.info["layers_description"],
                     "parameters": f"{params / 1e6:,.1f} M", "file": path.name})
    click.echo(pd.DataFrame(rows).to_string(index=False))


@catalog_group.command("hardware")
def hardware_command():
    """List the catalog's devices and clusters.

    The fp16 rate is the device's headline tensor rate; the training rate
    is the one bf16 (and fp16 with fp32 accumulation) runs at and the one a
    plan's MFU is a share of: half the headline on GeForce cards, whose
    headline holds with fp16 accumulation only.

    \b
    Example:
      pipesearch catalog hardware
    """
    rows = []
    for name in list_entries("device"):
        d = load_device(name)
        rows.append({"device": name, "memory": format_bytes(d.memory_bytes),
                     "fp16 TFLOP/s": f"{d.peak_fp16_flops / 1e12:g}",
                     "training TFLOP/s": f"{d.mfu_peak_flops / 1e12:g}",
                     "HBM GB/s": f"{d.hbm_bandwidth_bytes_per_s / 1e9:g}"})
    click.echo(pd.DataFrame(rows).to_string(index=False))
    click.echo()
    rows = []
    for name in list_entries("cluster"):
        c = load_cluster(name)
        rows.append({"cluster": name, "devices": c.num_devices, "nodes": c.num_nodes,
                     "device types": ",".join(sorted({g.device.name for g in c.groups})),
                     "intra-node GB/s": f"{c.intra_node.bandwidth_bytes_per_s / 1e9:g}",
                     "inter-node GB/s": f"{c.inter_node.bandwidth_bytes_per_s / 1e9:g}"})
    click.echo(pd.DataFrame(rows).to_string(index=False))


@catalog_group.command("show")
@click.argument("name")
def show_command(name):
    """Show one catalog entry: a cluster or device as JSON of its key figures,
    a model as its file (profile CSV or transformer TOML).

    \b
    Examples:
      pipesearch catalog show 2x8-a100-80gb
      pipesearch catalog show a100-80gb
      pipesearch catalog show vgg16
    """
    for kind in ("cluster", "device"):
        if name in list_entries(kind):
            obj = describe_cluster(load_cluster(name)) if kind == "cluster" else load_device(name).__dict__
            click.echo(json.dumps(obj, indent=2, default=str))
            return
    if name in list_entries("model"):
        click.echo(resolve("model", name).read_text())
        return
    every = [n for kind in ("model", "device", "cluster") for n in list_entries(kind)]
    close = difflib.get_close_matches(name, every, n=4, cutoff=0.4)
    hint = f"did you mean {', '.join(close)}?" if close else "`pipesearch catalog models` and `... hardware` list them"
    raise CatalogError(f"no catalog entry {name!r} (models, devices, clusters); {hint}")
