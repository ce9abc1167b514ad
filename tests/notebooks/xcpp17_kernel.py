#!/usr/bin/env python3
# All chapters — the notebooks: the project's own `xcpp17` Jupyter kernel, which CI
# runs the notebooks with: each cell goes to Cling the way xeus-cling sends it.
# Depends on: cppyy (Cling from PyPI's cppyy-cling) and ipykernel, pinned in
# requirements.txt; shim/xcpp/xdisplay.hpp for xcpp::display.
"""A Jupyter kernel that runs C++17 cells in Cling, close to xeus-cling.

What it copies from xeus-cling (src/xinterpreter.cpp, src/xparser.cpp):
  - a cell is split into runs of `#include` lines and runs of other lines,
    and the runs go to Cling one after the other, stopping at the first error;
  - stdout and stderr of the cell become `stream` messages;
  - `xcpp::display(obj)` becomes a `display_data` message holding
    `mime_bundle_repr(obj)`, sent after the stdout text the cell had flushed
    by then: xeus-cling sends a picture at once but std::cout's text only on
    a flush or at the end of the cell, so text printed before a display and
    not flushed comes after the picture here too (C's stdout gets a buffer
    larger than any cell's output, so such text never spills out early);
  - a compile error or an escaping exception makes an `error` reply
    ("Interpreter Error" / "Standard Exception"), so nbclient stops there.
Where it differs, on purpose:
  - output is captured at the file-descriptor level (so printf and output
    from the loaded library count too) and sent when the cell ends, in the
    order xeus-cling would have sent it, stderr last;
  - a cell ending on a bare expression is printed by Cling's own value
    printer as text, not as an execute_result (the notebooks' authoring
    rules forbid such cells; run_notebooks.py rejects them);
  - Cling's redefinition of names (which cppyy's Cling allows by default) is
    switched off, because standalone Cling, and so xeus-cling, refuses it.
"""

import ctypes
import json
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_INCLUDE = os.path.join(HERE, "shim")
# C's stdout buffer: larger than all the text a cell prints, so that text
# reaches the capture file only when the cell flushes it (or at its end).
STDOUT_BUFFER_BYTES = 64 << 20
_IOFBF = 0  # glibc's value


def cling_environment(prefix):
    """The environment cppyy needs to run Cling as C++17, reusing a PCH in `prefix`.

    cppyy-cling's wheel precompiles its standard headers for C++20; xeus-cling's
    xcpp17 kernel is C++17, so the kernel asks for -std=c++17 and keeps the
    matching precompiled header in the virtualenv (built once, seconds).
    No -march=native: JIT code must round the same way on every machine.
    """
    return {
        "EXTRA_CLING_ARGS": "-std=c++17 -O2",
        "CLING_STANDARD_PCH": os.path.join(prefix, "share", "mpt-cling", "allDict.cxx.pch.cxx17"),
    }


def split_from_includes(code):
    """Runs of `#include` lines and runs of other lines, as xeus-cling cuts a cell.

    Like xeus-cling's split_from_includes: a line counts as an include only
    when it starts with `#include`; empty lines are dropped.
    """
    blocks = []
    kind = None
    for line in code.split("\n"):
        if not line:
            continue
        this = "include" if re.fullmatch(r"#include.*", line) else "code"
        if this != kind:
            blocks.append("")
            kind = this
        blocks[-1] += line + "\n"
    return blocks


class Cling:
    """One Cling interpreter in this process, driven through cppyy."""

    def __init__(self):
        for key, value in cling_environment(sys.prefix).items():
            os.environ.setdefault(key, value)
        os.makedirs(os.path.dirname(os.environ["CLING_STANDARD_PCH"]), exist_ok=True)
        import cppyy  # noqa: E402 - must follow the environment set-up above

        self.cppyy = cppyy
        self.libc = ctypes.CDLL(None)
        self.libc.fflush.argtypes = [ctypes.c_void_p]
        self._buffer_stdout()
        self.process("cling::runtime::gClingOpts->AllowRedefinition = 0;")
        cppyy.add_include_path(SHIM_INCLUDE)

    def _buffer_stdout(self):
        """Give C's stdout (std::cout writes through it) one large buffer.

        xeus-cling's std::cout sends its text to the notebook only when it is
        flushed or the cell ends; a FILE buffer of the default few KiB would
        let long unflushed text reach the capture file, and so the notebook,
        before a picture displayed after it. The buffer lives as long as the
        interpreter (self._stdout_buffer).
        """
        stdout = ctypes.c_void_p.in_dll(self.libc, "stdout")
        self.libc.fflush(stdout)
        self._stdout_buffer = ctypes.create_string_buffer(STDOUT_BUFFER_BYTES)
        self.libc.setvbuf.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t]
        if self.libc.setvbuf(stdout, self._stdout_buffer, _IOFBF, STDOUT_BUFFER_BYTES) != 0:
            raise RuntimeError("setvbuf(stdout) failed")

    def process(self, block):
        """Run one block like the cling prompt; True when it compiled and ran."""
        error = ctypes.c_int(0)
        try:
            self.cppyy.gbl.gInterpreter.ProcessLine(block, ctypes.pointer(error))
        except Exception as e:  # cppyy turns some C++ failures into Python ones
            sys.__stderr__.write(f"cling: {e}\n")
            sys.__stderr__.flush()
            return False
        return error.value == 0

    def flush(self):
        """Push C++ and C buffers to the file descriptors before they are read."""
        std = self.cppyy.gbl.std
        std.cout.flush()
        std.cerr.flush()
        self.libc.fflush(None)

    def take_displays(self):
        """(stdout offset, mime bundle) for each xcpp::display since the last call."""
        try:
            queue = self.cppyy.gbl.xcpp.kernel_bridge.pending()
        except AttributeError:  # the cell never included xcpp/xdisplay.hpp
            return []
        displays = [(int(p.stdout_offset), json.loads(str(p.bundle))) for p in queue]
        queue.clear()
        return displays


class CapturedOutput:
    """Points fds 1 and 2 at temporary files for the duration of a cell."""

    def __init__(self, cling):
        self.cling = cling
        self.stdout = b""
        self.stderr = b""

    def __enter__(self):
        self.cling.flush()
        self.files = {fd: self._open(name) for fd, name in ((1, "stdout"), (2, "stderr"))}
        self.saved = {fd: os.dup(fd) for fd in (1, 2)}
        for fd, f in self.files.items():
            os.dup2(f.fileno(), fd)
        return self

    @staticmethod
    def _open(name):
        # A cell that crashes the process takes its output along, unless the
        # output sits in a file that outlives it: the runner shows these.
        keep = os.environ.get("MPT_XCPP_CAPTURE_DIR")
        if keep:
            os.makedirs(keep, exist_ok=True)
            return open(os.path.join(keep, f"kernel-{os.getpid()}-{name}.txt"), "w+b")
        return tempfile.TemporaryFile()

    def __exit__(self, *exc):
        self.cling.flush()
        for fd in (1, 2):
            os.dup2(self.saved[fd], fd)
            os.close(self.saved[fd])
        for fd, f in self.files.items():
            f.seek(0)
            data = f.read()
            f.close()
            if fd == 1:
                self.stdout = data
            else:
                self.stderr = data
        return False


# Cling's words for an exception that escaped a cell (TCling::ProcessLine).
EXCEPTION_LINE = re.compile(r"^compilation failed(?:: (.*)| with unknown error)$", re.M)
DIAGNOSTIC_ERROR = re.compile(r"^.*\berror: .*$", re.M)


def classify_failure(stderr_text):
    """(ename, evalue, stderr without Cling's exception line) for a failed cell."""
    diagnostic = DIAGNOSTIC_ERROR.search(stderr_text)
    if diagnostic:
        return "Interpreter Error", diagnostic.group(0).strip(), stderr_text
    exception = EXCEPTION_LINE.search(stderr_text)
    if exception:
        rest = (stderr_text[: exception.start()] + stderr_text[exception.end():]).strip("\n")
        rest = rest + "\n" if rest else ""
        if exception.group(1) is None:
            return "Error", "unknown exception", rest
        return "Standard Exception", exception.group(1), rest
    return "Interpreter Error", "", stderr_text


def main():
    from ipykernel.kernelapp import IPKernelApp
    from ipykernel.kernelbase import Kernel

    class Xcpp17Kernel(Kernel):
        implementation = "mpt-xcpp17"
        implementation_version = "1.0"
        # The same language_info xeus-cling reports, so a notebook executed
        # here carries the metadata it would carry after real xeus-cling.
        language_info = {
            "name": "c++",
            "version": "17",
            "mimetype": "text/x-c++src",
            "codemirror_mode": "text/x-c++src",
            "file_extension": ".cpp",
        }
        banner = "mpt's xcpp17 kernel: C++17 in Cling (cppyy-cling), for running notebooks without xeus-cling"

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.cling = Cling()

        def _stream(self, name, text):
            if text:
                self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})

        async def do_execute(self, code, silent, store_history=True, user_expressions=None,
                             allow_stdin=False, **kwargs):
            ok = True
            with CapturedOutput(self.cling) as out:
                for block in split_from_includes(code):
                    if not self.cling.process(block):
                        ok = False
                        break
            displays = self.cling.take_displays()
            stderr_text = out.stderr.decode("utf-8", "replace")
            if not ok:
                ename, evalue, stderr_text = classify_failure(stderr_text)
            if not silent:
                start = 0
                for offset, bundle in displays:
                    offset = max(start, min(offset, len(out.stdout)))
                    self._stream("stdout", out.stdout[start:offset].decode("utf-8", "replace"))
                    self.send_response(self.iopub_socket, "display_data",
                                       {"data": bundle, "metadata": {}, "transient": {}})
                    start = offset
                self._stream("stdout", out.stdout[start:].decode("utf-8", "replace"))
                self._stream("stderr", stderr_text)
            if ok:
                return {"status": "ok", "execution_count": self.execution_count,
                        "payload": [], "user_expressions": {}}
            traceback = [f"{ename}: {evalue}"]
            if not silent:
                self.send_response(self.iopub_socket, "error",
                                   {"ename": ename, "evalue": evalue, "traceback": traceback})
            return {"status": "error", "execution_count": self.execution_count,
                    "ename": ename, "evalue": evalue, "traceback": traceback}

    # The kernel captures fds itself around each cell; ipykernel's own fd
    # watcher would compete for them.
    IPKernelApp.launch_instance(kernel_class=Xcpp17Kernel, capture_fd_output=False)


if __name__ == "__main__":
    main()
