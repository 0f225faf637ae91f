"""Package layout: decoding imports neither the lab (training, benchmarks) nor the CLI, and no source file is
longer than 400 lines."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400

DECODE = """
import sys
import packed_ss
model = packed_ss.load_model()
tokens = packed_ss.load_tokenizer().encode("def fibonacci(n):").ids
res = packed_ss.Engine(model, schedule="packed", width=4).generate(tokens, max_new_tokens=8)
assert res.tokens
print("\\n".join(sorted(m for m in sys.modules if m.startswith("packed_ss"))))
"""


def test_decoding_imports_no_lab_and_no_cli():
    run = subprocess.run([sys.executable, "-c", DECODE], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = run.stdout.split()
    assert "packed_ss.engine" in loaded
    assert [m for m in loaded if m == "packed_ss.lab" or m.startswith("packed_ss.lab.")] == []
    assert "packed_ss.cli" not in loaded


def test_no_source_file_over_400_lines():
    sources = sorted((ROOT / "packed_ss").rglob("*.py")) + sorted((ROOT / "kernels").rglob("*.py"))
    sources = list(dict.fromkeys(p.resolve() for p in sources))      # packed_ss/kernels links to kernels/
    assert sources
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
