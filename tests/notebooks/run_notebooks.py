#!/usr/bin/env python3
# All chapters — the notebooks: executes every notebooks/*.ipynb top to bottom with the
# project's xcpp17 kernel and checks (or stores) their outputs.
# Depends on: requirements.txt and xcpp17_kernel.py beside this file, the
# shared library built by notebooks/CMakeLists.txt, PyPI on the first run.
"""Run the notebooks the way CI does.

    run_notebooks.py --check  --lib BUILD/notebooks/libmpt.so --work-dir BUILD/notebooks
    run_notebooks.py --update --lib ... --work-dir ...   (store the new outputs)
    run_notebooks.py --lab    --lib ... --work-dir ...   (JupyterLab with this kernel)
    run_notebooks.py --setup  --lib ... --work-dir ...   (the virtualenv and kernel only)
    run_notebooks.py --check  ... notebooks/02-loss-scaling.ipynb   (one notebook; CTest runs each alone)

Set-up (stdlib only, any Python 3.11): a virtualenv in WORK_DIR/venv with the
pinned requirements, reused while requirements.txt and the Python version are
unchanged. Then the script runs itself again inside that virtualenv to
register the kernel (as `xcpp17`, in the virtualenv's prefix only), lint the
notebooks against the authoring rules, execute them with nbclient and compare
each code cell's outputs with the committed ones.

Output comparison: the committed and the new outputs of a code cell must be
equal after this normalisation only: consecutive stream outputs of the same
name are joined, "\\r\\n" becomes "\\n", and the mime data of display_data and
execute_result outputs are compared mime type by mime type (text as text,
JSON data as sorted JSON). Execution counts and metadata are not compared.
"""

import argparse
import copy
import difflib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NOTEBOOK_DIR = os.path.join(REPO, "notebooks")
REQUIREMENTS = os.path.join(HERE, "requirements.txt")
KERNEL_SCRIPT = os.path.join(HERE, "xcpp17_kernel.py")
KERNEL_NAME = "xcpp17"
SETUP_VERSION = 1  # bump to force every build directory to rebuild its virtualenv


def say(msg):
    print(f"run_notebooks: {msg}", flush=True)


def fail(msg):
    say(f"FAILED: {msg}")
    sys.exit(1)


# --- set-up: the virtualenv -------------------------------------------------

def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def setup_stamp():
    with open(REQUIREMENTS, "rb") as f:
        req = hashlib.sha256(f.read()).hexdigest()
    return {"requirements_sha256": req, "python": sys.version, "setup_version": SETUP_VERSION}


def ensure_venv(work_dir):
    """Create or reuse WORK_DIR/venv; returns seconds spent. Exits on failure."""
    venv = os.path.join(work_dir, "venv")
    stamp_path = os.path.join(venv, "mpt-setup-stamp.json")
    want = setup_stamp()
    os.makedirs(work_dir, exist_ok=True)
    t0 = time.monotonic()
    # Two runs (the test and notebooks-update) must not build one venv at once.
    with open(os.path.join(work_dir, "venv.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(stamp_path) as f:
                if json.load(f) == want and os.path.exists(venv_python(venv)):
                    say(f"set-up: reusing {venv} ({time.monotonic() - t0:.1f} s)")
                    return venv
        except (OSError, ValueError):
            pass
        say(f"set-up: creating {venv} (pinned packages from PyPI; a few minutes)")
        shutil.rmtree(venv, ignore_errors=True)
        r = subprocess.run([sys.executable, "-m", "venv", venv])
        if r.returncode != 0:
            fail(f"'{sys.executable} -m venv' failed; on Debian install python3-venv")
        log_path = os.path.join(work_dir, "pip-install.log")
        t_pip = time.monotonic()
        with open(log_path, "w") as log:
            # Short timeouts: without network the test must fail soon, not hang.
            r = subprocess.run(
                [venv_python(venv), "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                 "--prefer-binary", "--timeout", "30", "--retries", "2", "-r", REQUIREMENTS],
                stdout=log, stderr=subprocess.STDOUT)
        t_pip = time.monotonic() - t_pip
        if r.returncode != 0:
            with open(log_path) as log:
                tail = log.read().splitlines()[-15:]
            print("\n".join("    " + line for line in tail))
            fail("could not install the notebook kernel's packages (tests/notebooks/requirements.txt) "
                 f"with pip; it needs PyPI the first time it runs in a build directory (no network?), "
                 f"a C++ compiler and Python headers (python3-dev). Full log: {log_path}")
        # The first start of Cling as C++17 precompiles its standard headers;
        # do it here so that a set-up failure shows as one.
        t_pch = time.monotonic()
        r = subprocess.run(
            [venv_python(venv), "-c",
             f"import sys; sys.path.insert(0, {HERE!r}); import xcpp17_kernel; xcpp17_kernel.Cling()"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))  # no __pycache__ in the source tree
        t_pch = time.monotonic() - t_pch
        if r.returncode != 0:
            print(r.stdout)
            fail("Cling (cppyy) does not start in the new virtualenv")
        with open(stamp_path, "w") as f:
            json.dump(want, f)
        say(f"set-up: virtualenv ready in {time.monotonic() - t0:.1f} s "
            f"(pip {t_pip:.1f} s, Cling C++17 start and PCH {t_pch:.1f} s)")
    return venv


# --- inside the virtualenv: kernel, lint, execute, compare ------------------

def jupyter_environment(venv, work_dir):
    """Keep Jupyter's files in the build directory and find our kernelspec first."""
    jdir = os.path.join(work_dir, "jupyter")
    env = {
        "JUPYTER_PATH": os.path.join(venv, "share", "jupyter"),
        "JUPYTER_CONFIG_DIR": os.path.join(jdir, "config"),
        "JUPYTER_DATA_DIR": os.path.join(jdir, "data"),
        "JUPYTER_RUNTIME_DIR": os.path.join(jdir, "runtime"),
        "IPYTHONDIR": os.path.join(jdir, "ipython"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "MPT_XCPP_CAPTURE_DIR": os.path.join(jdir, "capture"),
    }
    for path in env.values():
        if path.startswith(jdir):
            os.makedirs(path, exist_ok=True)
    return env


def install_kernelspec(venv):
    """Register xcpp17 in the virtualenv's prefix (never in the user's Jupyter dirs)."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = {
        # ERROR: ipykernel's start-up warnings would only clutter the test log.
        "argv": [venv_python(venv), KERNEL_SCRIPT, "-f", "{connection_file}", "--log-level=ERROR"],
        "display_name": "C++17",
        "language": "C++17",
    }
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "kernel.json"), "w") as f:
            json.dump(spec, f, indent=1)
        KernelSpecManager().install_kernel_spec(tmp, kernel_name=KERNEL_NAME, prefix=venv)
    found = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    if found.argv[:2] != spec["argv"][:2]:
        fail(f"kernel '{KERNEL_NAME}' resolves to {found.resource_dir}, not the project's kernel")


def code_lines(source):
    """Lines of a cell without // comments and trailing blanks (good enough for the lint)."""
    lines = []
    for line in source.split("\n"):
        line = re.sub(r"(^|\s)//.*$", "", line).rstrip()
        if line:
            lines.append(line)
    return lines


# A Cling pragma naming an absolute path ("/usr/include/eigen3" is one machine's).
ABSOLUTE_PATH_PRAGMA = re.compile(r'^#\s*pragma\s+cling\s+(?:add_include_path|add_library_path|load)\s*\(\s*"/')

# A top-level declaration of a const variable (not a reference or pointer to const).
TOP_LEVEL_CONST = re.compile(r"^(?:static\s+)?(?:constexpr|const)\s([^=;{(]*)[=({]")


def lint(nb, name):
    """The authoring rules that can be checked without running the cell."""
    problems = []
    ks = nb.metadata.get("kernelspec", {})
    want = {"name": "xcpp17", "display_name": "C++17", "language": "C++17"}
    for key, value in want.items():
        if ks.get(key) != value:
            problems.append(f"kernelspec {key} is {ks.get(key)!r}, must be {value!r}")
    setup_cells = True
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        where = f"{name} cell {i}"
        lines = code_lines(cell.source)
        if not lines:
            problems.append(f"{where}: empty code cell")
            continue
        directives = [l for l in lines if l.lstrip().startswith("#")]
        if setup_cells and len(directives) < len(lines):
            setup_cells = False
        if not setup_cells and directives:
            problems.append(f"{where}: '{directives[0].strip()}' after the first cell with code "
                            "(rule 1: pragmas and includes go in the first cells)")
        for line in directives:
            m = ABSOLUTE_PATH_PRAGMA.match(line.strip())
            if m:
                problems.append(f"{where}: '{line.strip()}' (rule 1: no absolute paths; the include "
                                "directories the library was built with come from .lib/include_paths.hpp)")
        if not lines[0].startswith("namespace"):
            for line in lines:
                m = TOP_LEVEL_CONST.match(line)
                if m and not re.search(r"[&*]", m.group(1)):
                    problems.append(f"{where}: '{line.strip()}' (rule 5: no const variables at the top "
                                    "of a cell; Cling may initialise them before the cell's other variables)")
        last = lines[-1].strip()
        if not last.startswith("#") and not last.endswith((";", "}")):
            problems.append(f"{where}: ends on '{last}' (rule 3: print explicitly with std::cout; "
                            "a bare expression is shown differently by each kernel)")
        if any(t in cell.source for t in ("__global__", "<<<", "cuda_runtime", "cuda_fp16")):
            problems.append(f"{where}: CUDA code (notebooks are CPU only)")
    return problems


def comparable(outputs):
    """The normalised outputs of one cell: (kind, name, text) triples."""
    items = []
    for o in outputs:
        kind = o["output_type"]
        if kind == "stream":
            text = "".join(o["text"]) if isinstance(o["text"], list) else o["text"]
            text = text.replace("\r\n", "\n")
            if items and items[-1][0] == "stream" and items[-1][1] == o["name"]:
                items[-1] = ("stream", o["name"], items[-1][2] + text)
            else:
                items.append(("stream", o["name"], text))
        elif kind in ("display_data", "execute_result"):
            for mime in sorted(o["data"]):
                value = o["data"][mime]
                if isinstance(value, list):
                    value = "".join(value)
                if not isinstance(value, str):
                    value = json.dumps(value, sort_keys=True, indent=1)
                items.append((kind, mime, value.replace("\r\n", "\n")))
        else:
            items.append((kind, o.get("ename", ""), o.get("evalue", "")))
    return items


def render(items):
    lines = []
    for kind, name, text in items:
        lines.append(f"[{kind} {name}]")
        lines.extend(text.split("\n"))
    return lines


def cell_title(i, cell):
    first = next((l for l in cell.source.split("\n") if l.strip()), "")
    return f"cell {i} ({first.strip()[:60]!r})"


def execute(nb, cwd):
    """Run a copy of nb in a fresh kernel; (executed notebook, error message or None)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    run = copy.deepcopy(nb)
    for cell in run.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    client = NotebookClient(run, kernel_name=KERNEL_NAME, timeout=300, startup_timeout=120,
                            allow_errors=False, record_timing=False,
                            resources={"metadata": {"path": cwd}})
    try:
        client.execute()
    except CellExecutionError as e:
        return run, str(e)
    except Exception as e:  # a dead kernel, a timeout
        return run, f"{type(e).__name__}: {e}"
    return run, None


def failing_cell_report(run):
    """What the failing cell printed, for the log.

    A cell that crashed the kernel sent nothing; the kernel's capture files
    (MPT_XCPP_CAPTURE_DIR) still hold what it printed, a stack trace included.
    """
    report = ""
    started = [i for i, c in enumerate(run.cells)
               if c.cell_type == "code" and c.get("execution_count") is not None]
    if started:
        cell = run.cells[started[-1]]
        report = f"the failing cell is {cell_title(started[-1], cell)}; it printed:\n" + "\n".join(
            "    " + l for l in render(comparable(cell.outputs)))
    capture = os.environ["MPT_XCPP_CAPTURE_DIR"]
    for name in sorted(os.listdir(capture)):
        with open(os.path.join(capture, name), errors="replace") as f:
            lines = f.read().splitlines()
        if len(lines) > 40:  # a stack trace: its head names the signal, its tail the frames
            lines = lines[:5] + ["..."] + lines[-30:]
        if lines:
            report += f"\nthe kernel's last captured {name}:\n" + "\n".join("    " + l for l in lines)
    return report


def lib_links(lib):
    """notebooks/.lib/ entry -> file of the build: the library and its include paths.

    notebooks/CMakeLists.txt writes include_paths.hpp (Cling pragmas naming
    the include directories the library was built with) beside libmpt.so.
    """
    lib = os.path.abspath(lib)
    return {"libmpt.so": lib,
            "include_paths.hpp": os.path.join(os.path.dirname(lib), "include_paths.hpp")}


def replace_link(link, target):
    if os.path.islink(link) or os.path.exists(link):
        os.remove(link)
    os.symlink(target, link)


def stage(work_dir, lib):
    """A folder laid out like the repository, whose notebooks/.lib/ links to `lib`'s build.

    The notebooks load `.lib/libmpt.so`, include `.lib/include_paths.hpp`
    and add chapter folders (`../chapters/...`) to the include path,
    relative to their own folder; running them from this copy of that
    layout tests the library of this build directory whatever notebooks/.lib
    points at.
    """
    root = os.path.join(work_dir, "stage")
    nb_dir = os.path.join(root, "notebooks")
    os.makedirs(os.path.join(nb_dir, ".lib"), exist_ok=True)
    for name in ("chapters",):
        replace_link(os.path.join(root, name), os.path.join(REPO, name))
    for name, target in lib_links(lib).items():
        if not os.path.exists(target):
            fail(f"{target} does not exist; build the target mpt_notebook first")
        replace_link(os.path.join(nb_dir, ".lib", name), target)
    return nb_dir


def run_dir(args):
    """This run's own folder under WORK_DIR (Jupyter's files, the capture, the
    staged tree): runs of different notebooks (one CTest each, in parallel)
    share the virtualenv and nothing else."""
    if len(args.notebooks) == 1:
        name = os.path.splitext(os.path.basename(args.notebooks[0]))[0]
    else:
        name = "all"
    return os.path.join(args.work_dir, "runs", name)


def in_venv(args):
    import nbformat

    venv = sys.prefix
    here = run_dir(args)
    os.environ.update(jupyter_environment(venv, here))
    # The kernelspec lives in the shared virtualenv: one writer at a time.
    with open(os.path.join(args.work_dir, "venv.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        install_kernelspec(venv)
    if args.mode == "setup":
        say(f"set-up: kernel '{KERNEL_NAME}' registered in {venv}")
        return 0
    if args.mode == "lab":
        return lab(args, venv)

    notebooks = args.notebooks or sorted(
        os.path.join(NOTEBOOK_DIR, n) for n in os.listdir(NOTEBOOK_DIR) if n.endswith(".ipynb"))
    if not notebooks:
        fail(f"no notebooks in {NOTEBOOK_DIR}")
    cwd = stage(here, args.lib)
    failures = 0
    t0 = time.monotonic()
    for path in notebooks:
        name = os.path.relpath(path, REPO)
        nb = nbformat.read(path, as_version=4)
        problems = lint(nb, name)
        if problems:
            failures += 1
            say(f"{name}: breaks the authoring rules (notebooks/README.md):")
            for p in problems:
                print(f"    {p}")
            continue
        capture = os.environ["MPT_XCPP_CAPTURE_DIR"]
        shutil.rmtree(capture, ignore_errors=True)
        os.makedirs(capture)
        t = time.monotonic()
        run, error = execute(nb, cwd)
        seconds = time.monotonic() - t
        code_cells = sum(c.cell_type == "code" for c in nb.cells)
        if error:
            failures += 1
            say(f"{name}: a cell failed after {seconds:.1f} s:\n{error}\n{failing_cell_report(run)}")
            continue
        if args.mode == "update":
            nbformat.validate(run)
            before = nbformat.writes(nb)
            after = nbformat.writes(run)
            if before != after:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(after)
                say(f"{name}: outputs stored ({code_cells} code cells, {seconds:.1f} s)")
            else:
                say(f"{name}: unchanged ({code_cells} code cells, {seconds:.1f} s)")
            continue
        changed = 0
        for i, (old, new) in enumerate(zip(nb.cells, run.cells)):
            if old.cell_type != "code":
                continue
            a, b = render(comparable(old.outputs)), render(comparable(new.outputs))
            if a != b:
                changed += 1
                say(f"{name} {cell_title(i, old)}: output differs from the committed one:")
                for line in difflib.unified_diff(a, b, "committed", "now", lineterm="", n=2):
                    print("    " + line)
        if changed:
            failures += 1
            say(f"{name}: {changed} cell(s) changed output; if the change is intended, "
                "regenerate with: cmake --build BUILD --target notebooks-update")
        else:
            say(f"{name}: ok ({code_cells} code cells executed, outputs match, {seconds:.1f} s)")
    say(f"execution: {len(notebooks)} notebook(s) in {time.monotonic() - t0:.1f} s, "
        f"{failures} failed")
    return 1 if failures else 0


def lab(args, venv):
    """JupyterLab on notebooks/ with this kernel, for people without conda."""
    if shutil.which("jupyter-lab", path=os.path.join(venv, "bin")) is None:
        say("installing JupyterLab into the notebook virtualenv (once)")
        subprocess.run([venv_python(venv), "-m", "pip", "install", "--no-input", "jupyterlab"],
                       check=True)
    os.makedirs(os.path.join(NOTEBOOK_DIR, ".lib"), exist_ok=True)
    for name, target in lib_links(args.lib).items():
        replace_link(os.path.join(NOTEBOOK_DIR, ".lib", name), target)
    argv = ["jupyter-lab", "--notebook-dir", NOTEBOOK_DIR]
    if os.geteuid() == 0:  # Jupyter refuses root unless told; containers often are root
        argv.append("--allow-root")
    os.chdir(NOTEBOOK_DIR)
    os.execv(os.path.join(venv, "bin", "jupyter-lab"), argv)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", dest="mode", action="store_const", const="check",
                      help="execute and compare with the committed outputs")
    mode.add_argument("--update", dest="mode", action="store_const", const="update",
                      help="execute and store the new outputs in the notebooks")
    mode.add_argument("--setup", dest="mode", action="store_const", const="setup",
                      help="only create the virtualenv and register the kernel (the CTest fixture)")
    mode.add_argument("--lab", dest="mode", action="store_const", const="lab",
                      help="start JupyterLab on notebooks/ with the project's xcpp17 kernel")
    p.add_argument("--lib", required=True, help="the notebook library (BUILD/notebooks/libmpt.so)")
    p.add_argument("--work-dir", required=True, help="where the virtualenv and scratch files live")
    p.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("notebooks", nargs="*", help="notebooks to run (default: notebooks/*.ipynb)")
    args = p.parse_args()
    args.work_dir = os.path.abspath(args.work_dir)
    args.notebooks = [os.path.abspath(n) for n in args.notebooks]
    if not os.path.exists(args.lib):
        fail(f"{args.lib} does not exist; build the target mpt_notebook first")
    if args.in_venv:
        sys.exit(in_venv(args))
    venv = ensure_venv(args.work_dir)
    cmd = [venv_python(venv), os.path.abspath(__file__), "--in-venv", f"--{args.mode}",
           "--lib", os.path.abspath(args.lib), "--work-dir", args.work_dir] + args.notebooks
    sys.exit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()
