"""``cut``: write a structure-rule case (tests/cases/) from one or a few steps of a real trace."""

from __future__ import annotations

import click


@click.command("cut")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--step",
    "step",
    metavar="N|A-B",
    help="The step (or inclusive range) of `analyze` to keep; default: all.",
)
@click.option("--rank", type=int, help="Keep this rank's kernels only.")
@click.option(
    "--layer", type=int, help="Keep one decoder layer (and the forward's work outside every layer)."
)
@click.option(
    "--keep-annotations", is_flag=True, help="Keep the step annotations (a case of the annotated path)."
)
@click.option("--name", default="", help="The case's name (default: the output file's stem).")
@click.option("--description", default="", help="One line: the quirk the case captures.")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="The case file (.json, or .json.xz: xz-compressed).",
)
def command(
    trace: str,
    step: str | None,
    rank: int | None,
    layer: int | None,
    keep_annotations: bool,
    name: str,
    description: str,
    output: str,
) -> int:
    """Cut the kernels of TRACE's step N (or steps A-B) into a case file: the kernels, host ops and
    annotations of their window, and the expected stage, phase and layer of every kernel.

    The trace is analysed as `check` does (truth ranges and step annotations removed). Expected
    stages and phases come from the trace's truth ranges (`capture --truth`), phases else from an
    engine's step annotations; what neither gives is the analysis' own answer, marked `pinned`
    (layers always are). The case lists the structure and phase rules that fire on it and those
    that do not; tests/test_structure_cases.py checks both, and the expectations, for every case.
    A way to capture an engine's quirk without a GPU.
    """
    from pathlib import Path

    from analyzer.readers.case import write_case
    from analyzer.results.cases import cut_case, parse_steps
    from analyzer.runtime.driver import load_inputs

    if not output.endswith((".json", ".json.xz")):
        from analyzer.errors import UsageError

        raise UsageError(f"{output}: a case is a .json (or xz-compressed .json.xz) file")
    steps = parse_steps(step) if step else None
    loaded = load_inputs([trace])
    doc = cut_case(
        loaded,
        trace,
        steps=steps,
        rank=rank,
        layer=layer,
        keep_annotations=keep_annotations,
        name=name or Path(output).name.removesuffix(".json"),
        description=description,
    )
    write_case(doc, output)
    n = len(doc["kernels"]["name"]["index"])
    click.echo(
        f"wrote {output}: {n} kernels, rules firing {', '.join(doc['fires']) or 'none'}; "
        f"{doc['known_wrong']} kernels answered wrong and {doc['undecided']} phases unknown against the "
        f"expectations ({doc['expect_from']['stage']} stages, {doc['expect_from']['phase']} phases)",
        err=True,
    )
    if doc["differs_from_whole_trace"]:
        click.echo(
            f"warning: the cut alone answers {doc['differs_from_whole_trace']} stages / phases otherwise than "
            "the whole trace: it lost context the rules read (widen --step)",
            err=True,
        )
    return 0
