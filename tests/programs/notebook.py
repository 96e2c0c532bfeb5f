"""Executes a notebook in a real Jupyter kernel (nbclient, ipykernel) and prints each cell's outputs as one
JSON object per cell: {"n": execution count, "text": its stdout and stderr, "error": "Name: value" or null,
"html": the HTML it displayed, or null, "result": its Out (text/plain), or null}. The cells come as a JSON list on stdin; the kernel inherits this
process's environment (PYTHONPATH, the fake NVML's). Saves the executed notebook where argv[1] says, if
given.
    python notebook.py [OUT.ipynb] < cells.json"""
import json
import sys

import nbclient
import nbformat

nb = nbformat.v4.new_notebook()
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
for source in json.load(sys.stdin):
    nb.cells.append(nbformat.v4.new_code_cell(source))
client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True)
client.execute()
if len(sys.argv) > 1:
    nbformat.write(nb, sys.argv[1])
for cell in nb.cells:
    text, error, html, result = "", None, None, None
    for o in cell.outputs:
        if o.output_type == "stream":
            text += o.text
        elif o.output_type == "error":
            error = "%s: %s" % (o.ename, o.evalue)
        elif o.output_type == "execute_result":
            result = o.data.get("text/plain")
        elif "text/html" in o.get("data", {}):
            html = o.data["text/html"]
    print(json.dumps({"n": cell.execution_count, "text": text, "error": error, "html": html, "result": result}))
