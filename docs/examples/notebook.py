# %% [markdown]
# # llm-kernel-map in a notebook
#
# Cells of a Jupyter notebook (`# %%` markers: VS Code, JupyterLab's jupytext, or plain Python run it
# as is). Kept as a script so that the tests run it without a notebook kernel: nbclient would need
# ipykernel, jupyter_client and pyzmq in the test environment for what one `python` call checks.

# %%
import sys
from pathlib import Path

import plotly.express as px

import analyzer

ROOT = Path(__file__).resolve().parents[2]
trace = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "fixtures/h200-llama3-8b-dense/trace.json.gz"
out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "reports"

# %% Analyse a bundled real trace (the numbers `lkm analyze` prints)
result = analyzer.analyze(trace)
print(result.summary["gpu"]["name"], f"{result.summary['totals']['kernel_ns'] / 1e6:.2f} ms of kernels")

# %% The per-phase profile as a DataFrame
decode = result.phase_profile("decode")
print(decode[["label", "share", "bound"]].to_string(index=False))

# %% Time by stage and phase, from the kernels table (Arrow-backed dtypes)
k = result.kernels
by_stage = (
    k.groupby(["phase", "stage"], observed=True)["dur_ns"]
    .sum()
    .rename("time_ns")
    .reset_index()
    .sort_values("time_ns", ascending=False)
)
print(by_stage.head(8).to_string(index=False))

# %% One plotly figure: decode step times
steps = result.steps
fig = px.bar(steps, x="step", y="dur_ns", color="phase", title="Step time by step")
out.mkdir(parents=True, exist_ok=True)
fig.write_html(out / "notebook-steps.html", include_plotlyjs="cdn")

# %% The findings, most severe first
for f in result.findings[:3]:
    print(f"[{f['severity']}] {f['id']} {f['phase']}: {f['title']}")
