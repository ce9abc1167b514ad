#!/usr/bin/env bash
# Chapter 03 — `mpt op`, checked as a user sees it: every runnable op run
# from the command line, its printed outputs compared with references the
# cases compute themselves (python3, in double), and its bad input.
# Depends on: cli_lib.sh (the shared harness), bash, grep, sed; python3 for
# the references and the JSON (the cases that need it exit 77, Skipped,
# without it); src/mpt/core/ops.cpp, read for the names of the known ops.
#
# Usage: op_checks.sh PATH/TO/mpt CASE. Exit 0 pass, 1 fail, 77 skipped.
set -u

MPT=$1
CASE=$2
HERE=$(dirname "${BASH_SOURCE[0]}")
. "$HERE/cli_lib.sh"

# run ARGS...: run mpt with nothing on its standard input.
run() {
  ARGS="$*"
  "$MPT" "$@" </dev/null >"$OUT" 2>"$ERR"
  RC=$?
}

# run_in NUMBERS ARGS...: run mpt with NUMBERS on its standard input.
run_in() {
  local input=$1
  shift
  ARGS="$* <<< '$input'"
  printf '%s\n' "$input" | "$MPT" "$@" >"$OUT" 2>"$ERR"
  RC=$?
}

# check_py [ARG...] < program: run a python3 program after the helpers
# below, with the text output parsed (`out`: name -> (dtype, shape, values),
# values as floats, inf and nan included) and the arguments in `args`; its
# failure is the case's.
check_py() {
  cat >"$WORK/op_ref.py" <<'PY'
import math, re, struct, sys
args = sys.argv[2:]
f16 = lambda v: struct.unpack("e", struct.pack("e", v))[0]
f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]

# Each printed value is the shortest decimal that reads back as its float.
def parse(path):
    outs, name = {}, None
    for line in open(path):
        line = line.rstrip("\n")
        m = re.match(r"^(\S+): (\S+) (\S+)$", line)
        if m:
            name = m.group(1)
            shape = [] if m.group(3) == "scalar" else [int(s) for s in m.group(3).split("x")]
            outs[name] = (m.group(2), shape, [])
        elif line.startswith("  "):
            outs[name][2].extend(f32(float(v)) for v in line.split())
        else:
            assert line == "", "stray line %r" % line
    return outs

out = parse(sys.argv[1])

# |got - want| <= rel |want| + tol, element by element.
def close(got, want, rel, what, tol=0.0):
    assert len(got) == len(want), (what, len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= rel * abs(w) + tol, (what, i, g, w)

def matmul(a, b, n, k, m):  # a [n, k] times b [k, m], row-major lists, in double
    return [sum(a[i * k + t] * b[t * m + j] for t in range(k)) for i in range(n) for j in range(m)]

def transpose(a, r, c):
    return [a[i * c + j] for j in range(c) for i in range(r)]

def prod(xs):
    p = 1
    for v in xs:
        p *= v
    return p

# The gradient of sum(dy * f(v)) with respect to v by central differences.
def grad_fd(f, v, dy, h=1e-6):
    g = []
    for i in range(len(v)):
        a, b = list(v), list(v)
        a[i] += h
        b[i] -= h
        g.append(sum(d * (p - q) for d, p, q in zip(dy, f(a), f(b))) / (2 * h))
    return g

# Batch norm of x [N, C, L...] in double: y, batch mean, biased variance.
def batch_norm(x, shape, eps, gamma, beta, mean=None, var=None):
    n, c, l = shape[0], shape[1], prod(shape[2:])
    idx = lambda i, k, j: (i * c + k) * l + j
    if mean is None:
        mean = [sum(x[idx(i, k, j)] for i in range(n) for j in range(l)) / (n * l) for k in range(c)]
        var = [sum((x[idx(i, k, j)] - mean[k]) ** 2 for i in range(n) for j in range(l)) / (n * l)
               for k in range(c)]
    y = [0.0] * len(x)
    for i in range(n):
        for k in range(c):
            for j in range(l):
                t = idx(i, k, j)
                y[t] = (x[t] - mean[k]) / math.sqrt(var[k] + eps) * gamma[k] + beta[k]
    return y, mean, var

# Layer norm of x over rows of `width` elements, in double.
def layer_norm(x, width, eps, gamma, beta):
    y, means, rstds = [], [], []
    for r in range(len(x) // width):
        row = x[r * width:(r + 1) * width]
        m = sum(row) / width
        v = sum((a - m) ** 2 for a in row) / width
        means.append(m)
        rstds.append(1 / math.sqrt(v + eps))
        y += [(a - m) * rstds[-1] * g + b for a, g, b in zip(row, gamma, beta)]
    return y, means, rstds

# Cross-correlation as torch.nn.functional.conv2d, written out: x [N, C, H, W],
# w [O, C, k, k], b [O], zero padding p, stride s.
def conv2d(x, xs, w, b, o, k, s, p):
    n, c, h, wd = xs
    ho, wo = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
    y = []
    for i in range(n):
        for q in range(o):
            for r in range(ho):
                for t in range(wo):
                    acc = b[q]
                    for ch in range(c):
                        for u in range(k):
                            for v in range(k):
                                hh, ww = r * s - p + u, t * s - p + v
                                if 0 <= hh < h and 0 <= ww < wd:
                                    acc += x[((i * c + ch) * h + hh) * wd + ww] * w[((q * c + ch) * k + u) * k + v]
                    y.append(acc)
    return y, [n, o, ho, wo]

# Max or average pooling, written out (padding never the max, zeros in the mean).
def pool2d(x, xs, k, s, p, kind):
    n, c, h, wd = xs
    ho, wo = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
    y = []
    for i in range(n * c):
        for r in range(ho):
            for t in range(wo):
                vals = [x[(i * h + r * s - p + u) * wd + t * s - p + v] for u in range(k) for v in range(k)
                        if 0 <= r * s - p + u < h and 0 <= t * s - p + v < wd]
                y.append(max(vals) if kind == "max" else sum(vals) / (k * k))
    return y, [n, c, ho, wo]
PY
  { echo "from op_ref import *"; cat; } >"$WORK/check.py"
  PYTHONPATH=$WORK python3 "$WORK/check.py" "$OUT" "$@" || fail "python check failed (see above)"
}

# The op names of the table in src/mpt/core/ops.cpp, in order.
known_ops() {
  sed -nE 's/^ *\{"([a-z0-9_]+)", OpKind::.*/\1/p' "$HERE/../../src/mpt/core/ops.cpp"
}

# The ops each half of `mpt op list` names (first column of each table).
listed_runnable() { awk 'NR > 1 && NF == 0 { exit } NR > 1 { print $1 }' "$OUT"; }
listed_not_runnable() {
  awk '/^not runnable from the command line yet/ { on = 1; getline; next } on && NF == 0 { exit } on { print $1 }' "$OUT"
}

RUNNABLE="linear conv2d scaled_dot_product_attention relu gelu layer_norm batch_norm softmax log_softmax cross_entropy nll_loss mse_loss max_pool2d avg_pool2d"
RUNNABLE_LIST="linear, conv2d, scaled_dot_product_attention, relu, gelu, layer_norm, batch_norm, softmax, log_softmax, cross_entropy, nll_loss, mse_loss, max_pool2d, avg_pool2d"

case "$CASE" in

list)
  run op list
  expect_rc 0
  expect_out_regex '^op +chapter +inputs +outputs +what$'
  # Every runnable op with its chapter, in the order of the op table.
  expect_out_regex '^linear +2 +x \[B, in\] +y \[B, out\], weight \[out, in\], bias \[out\]; --backward: dx, dweight, dbias +y = x W\^T \+ b'
  expect_out_regex '^relu +2 +x, any shape +y; --backward: dx +max\(x, 0\), NaN kept$'
  expect_out_regex '^cross_entropy +2 +logits x \[B, C\]; class ids from --targets'
  expect_out_regex '^softmax +4 +x, any shape; over its last dimension +y; --backward: dx'
  expect_out_regex '^nll_loss +4 +log-probabilities x \[B, C\]'
  expect_out_regex '^batch_norm +3 +x \[N, C\], \[N, C, L\] or \[N, C, H, W\]'
  expect_out_regex '^conv2d +3 +x \[N, C, H, W\] +y \[N, out, H., W.\], weight \[out, C, k, k\]'
  listed_runnable >"$WORK/runnable"
  known_ops >"$WORK/known"
  [ "$(wc -l <"$WORK/known")" -ge 17 ] || fail "could not read the op table of ops.cpp"
  grep -Fxf "$WORK/runnable" "$WORK/known" >"$WORK/runnable_in_order"
  cmp -s "$WORK/runnable" "$WORK/runnable_in_order" || fail "runnable ops not in the op table's order"
  for op in $RUNNABLE; do grep -qx "$op" "$WORK/runnable" || fail "$op is not listed as runnable"; done
  # The rest of the table is named, each once, as not runnable yet.
  listed_not_runnable >"$WORK/rest"
  sort "$WORK/runnable" "$WORK/rest" >"$WORK/all"
  sort "$WORK/known" >"$WORK/known_sorted"
  cmp -s "$WORK/all" "$WORK/known_sorted" || fail "the list does not name every known op exactly once:
$(diff "$WORK/known_sorted" "$WORK/all")"
  expect_out_regex '^scaled_dot_product_attention +4 +q, k, v of one shape'
  grep -qx matmul "$WORK/rest" || fail "matmul (no layer) should be listed as not runnable yet"
  expect_out_regex '^matmul +2 +a matrix product'
  expect_out_regex '^embedding +4 +rows of a table'
  # Each runnable op is a subcommand, and each not-runnable one is told so.
  while read -r op; do
    run op "$op" --help
    expect_rc 0
    expect_out "Usage: mpt op $op "
  done <"$WORK/runnable"
  while read -r op; do
    run op "$op"
    expect_usage_error "'$op' is a known op but not runnable from the command line yet" "runnable ops: linear"
  done <"$WORK/rest"
  ;;

relu_forward)
  run_in "1.5 -2 0 -0 3.25 -1e-3" op relu --shape 2x3
  expect_rc 0
  expect_out_exactly "y: f32 2x3
  1.5 0 0
  0 3.25 0"
  ;;

relu_forward_exact)
  need_python
  # Any shape: one printed line per run of the last dimension.
  xs="0.1 -0.2 7 -8 1e-30 -1e30 3.4e38 0x1p-149"
  run_in "$xs" op relu --shape 2x2x2
  expect_rc 0
  check_py $xs <<'PY'
x = [f32(float.fromhex(a) if a.startswith("0x") else float(a)) for a in args]
dtype, shape, y = out["y"]
assert dtype == "f32" and shape == [2, 2, 2], (dtype, shape)
assert y == [max(v, 0.0) for v in x], (y, x)
assert list(out) == ["y"]
PY
  [ "$(grep -c '^  ' "$OUT")" -eq 4 ] || fail "expected 4 rows of 2"
  ;;

f16_rounding_visible)
  need_python
  # The input is rounded into --dtype before the op reads it: 65520 is the
  # midpoint between fp16's max 65504 and 2^16, and ties to even overflow.
  xs="65520 65519 0.1 1e-8 6e-8 -65520"
  run_in "$xs" op relu --shape 6 --dtype f16
  expect_rc 0
  expect_out_exactly "y: f16 6
  inf 65504 0.099975586 0 5.9604645e-08 0"
  check_py $xs <<'PY'
dtype, shape, y = out["y"]
assert dtype == "f16" and shape == [6]
x = [float(a) for a in args]
assert y[0] == math.inf and x[0] == 65520
for xi, yi in zip(x[1:5], y[1:5]):
    assert yi == f16(xi), (xi, yi, f16(xi))
PY
  # bf16 has fp32's range: 65520 rounds to 65536.
  run_in "65520" op relu --shape 1 --dtype bf16
  expect_out_exactly "y: bf16 1
  65536"
  # Kept in f32 by the policy, relu stores f32, but its input was already f16.
  run_in "$xs" op relu --shape 6 --dtype f16 --policy keep-f32:relu
  expect_rc 0
  expect_out_exactly "y: f32 6
  inf 65504 0.099975586 0 5.9604645e-08 0"
  # A policy that keeps another op in f32 leaves relu in f16.
  run_in "0.1" op relu --shape 1 --dtype f16 --policy keep-f32:linear,gelu
  expect_out_exactly "y: f16 1
  0.099975586"
  ;;

relu_backward)
  need_python
  # dy passes where the output is positive; at x = 0 (y = 0) it does not.
  run_in "1 -1 0 2   10 20 30 40" op relu --shape 2x2 --backward
  expect_rc 0
  expect_out_exactly "y: f32 2x2
  1 0
  0 2

dx: f32 2x2
  10 0
  0 40"
  # In f16 the gradient is stored in f16: 1e-8 flushes to 0, 65520 overflows.
  run_in "1 1 1 -1   1e-8 65520 0.1 5" op relu --shape 4 --dtype f16 --backward
  expect_rc 0
  check_py <<'PY'
dtype, shape, dx = out["dx"]
assert dtype == "f16" and shape == [4]
assert dx == [0.0, math.inf, f16(0.1), 0.0], dx
PY
  # A NaN stays NaN (PyTorch's relu), and a NaN output passes dy through
  # (threshold_backward: 0 only where y <= 0).
  run_in "nan -1 2   7 8 9" op relu --shape 3 --backward
  expect_rc 0
  expect_out_exactly "y: f32 3
  nan 0 2

dx: f32 3
  7 0 9"
  ;;

linear_forward)
  need_python
  xs="1 -2 0.5 3   0.25 4 -1 2   -3 0 1.5 -0.75"
  run_in "$xs" op linear --shape 3x4 --out-features 2 --seed 7
  expect_rc 0
  cp "$OUT" "$WORK/seed7"
  check_py $xs <<'PY'
x = [float(a) for a in args]
assert list(out) == ["y", "weight", "bias"], list(out)
(yd, ys, y), (wd, ws, w), (bd, bs, b) = out["y"], out["weight"], out["bias"]
assert (yd, ys, wd, ws, bd, bs) == ("f32", [3, 2], "f32", [2, 4], "f32", [2])
# The layer's own initialiser: uniform in +-1/sqrt(in).
assert all(abs(v) <= 0.5 for v in w + b) and len(set(w + b)) == 10
ref = matmul(x, transpose(w, 2, 4), 3, 4, 2)
ref = [r + b[i % 2] for i, r in enumerate(ref)]
close(y, ref, 1e-6, "y = x W^T + b")
PY
  # The seed makes the run reproducible, and another seed gives other weights.
  run_in "$xs" op linear --shape 3x4 --out-features 2 --seed 7
  cmp -s "$WORK/seed7" "$OUT" || fail "the same seed gave another run"
  run_in "$xs" op linear --shape 3x4 --out-features 2
  expect_rc 0
  ! cmp -s "$WORK/seed7" "$OUT" || fail "seeds 7 and 0 gave the same weights"
  # f16: the weights printed are the f16 copies the GEMM read, and y is
  # their f32-accumulated product rounded once into f16.
  run_in "$xs" op linear --shape 3x4 --out-features 2 --seed 7 --dtype f16
  expect_rc 0
  check_py $xs <<'PY'
x = [f16(float(a)) for a in args]
(yd, _, y), (wd, _, w), (bd, _, b) = out["y"], out["weight"], out["bias"]
assert (yd, wd, bd) == ("f16", "f16", "f16")
assert all(f16(v) == v for v in w + b)
ref = [r + b[i % 2] for i, r in enumerate(matmul(x, transpose(w, 2, 4), 3, 4, 2))]
for g, r in zip(y, ref):
    assert g == f16(r), (g, r, f16(r))
PY
  # keep-f32:linear: the model copy is the f32 master itself, y f32.
  run_in "$xs" op linear --shape 3x4 --out-features 2 --seed 7 --dtype f16 --policy keep-f32:linear
  expect_rc 0
  expect_out_regex '^y: f32 3x2$'
  expect_out_regex '^weight: f32 2x4$'
  sed -n '/^weight:/,/^$/p' "$WORK/seed7" >"$WORK/w_f32"
  sed -n '/^weight:/,/^$/p' "$OUT" >"$WORK/w_kept"
  cmp -s "$WORK/w_f32" "$WORK/w_kept" || fail "keep-f32:linear should print the f32 masters"
  ;;

linear_backward)
  need_python
  xs="1 -2 0.5   0.25 4 -1"
  dys="0.5 -1   2 0.125"
  run_in "$xs $dys" op linear --shape 2x3 --out-features 2 --seed 3 --backward
  expect_rc 0
  check_py $xs $dys <<'PY'
v = [float(a) for a in args]
x, dy = v[:6], v[6:]
assert list(out) == ["y", "weight", "bias", "dx", "dweight", "dbias"], list(out)
w = out["weight"][2]
assert out["dx"][:2] == ("f32", [2, 3]) and out["dweight"][:2] == ("f32", [2, 3])
assert out["dbias"][:2] == ("f32", [2])
close(out["dx"][2], matmul(dy, w, 2, 2, 3), 1e-6, "dx = dy W")
close(out["dweight"][2], matmul(transpose(dy, 2, 2), x, 2, 2, 3), 1e-6, "dW = dy^T x")
close(out["dbias"][2], [dy[0] + dy[2], dy[1] + dy[3]], 1e-6, "db = sum dy")
PY
  ;;

gelu)
  need_python
  xs="-3 -1 -0.5 0 0.5 1 2 4"
  for approx in none tanh; do
    run_in "$xs" op gelu --shape 2x4 --approximate $approx
    expect_rc 0
    check_py $approx $xs <<'PY'
approx, x = args[0], [float(a) for a in args[1:]]
def gelu(v):
    if approx == "tanh":
        return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))
# f32 evaluates 1 + erf (1 + tanh) with an absolute error of about an
# ulp of 1, which 0.5 x multiplies: the tolerance is relative plus that.
close(out["y"][2], [gelu(v) for v in x], 2e-6, "gelu " + approx, 0.5 * 4 * 2 ** -22)
# The two approximations differ by more than the tolerance at x = 1.
other = 0.5 * (1 + (math.erf(1 / math.sqrt(2)) if approx == "tanh" else
                    math.tanh(math.sqrt(2 / math.pi) * 1.044715)))
assert abs(out["y"][2][5] - other) > 1e-4
PY
  done
  # Exact is the default.
  run_in "$xs" op gelu --shape 2x4
  cp "$OUT" "$WORK/default"
  run_in "$xs" op gelu --shape 2x4 --approximate none
  cmp -s "$WORK/default" "$OUT" || fail "the default should be the exact gelu"
  # Backward against central differences of the exact formula, in double.
  run_in "$xs 1 2 -1 0.5 3 1 -2 0.25" op gelu --shape 8 --backward
  expect_rc 0
  check_py $xs 1 2 -1 0.5 3 1 -2 0.25 <<'PY'
v = [float(a) for a in args]
x, dy = v[:8], v[8:]
g = lambda t: 0.5 * t * (1 + math.erf(t / math.sqrt(2)))
h = 1e-5
close(out["dx"][2], [d * (g(t + h) - g(t - h)) / (2 * h) for t, d in zip(x, dy)], 1e-5, "gelu dx")
PY
  ;;

mse_loss)
  need_python
  xs="1 2 3 4 5 6"
  ts="0.5 0.5 0.5 -1 2 8"
  run_in "$xs $ts 4" op mse_loss --shape 2x3 --backward
  expect_rc 0
  check_py $xs $ts <<'PY'
v = [float(a) for a in args]
x, t = v[:6], v[6:]
assert list(out) == ["loss", "dx"]
assert out["loss"][:2] == ("f32", []) and out["dx"][:2] == ("f32", [2, 3])
close(out["loss"][2], [sum((a - b) ** 2 for a, b in zip(x, t)) / 6], 1e-6, "loss")
close(out["dx"][2], [2 * 4 * (a - b) / 6 for a, b in zip(x, t)], 1e-6, "dx with dloss 4")
PY
  # The target is read as f32; only the prediction is rounded into --dtype.
  run_in "0.3 0.1" op mse_loss --shape 1 --dtype f16
  check_py <<'PY'
assert out["loss"][0] == "f32"
close(out["loss"][2], [(f16(0.3) - f32(0.1)) ** 2], 1e-6, "f16 prediction, f32 target and loss")
PY
  ;;

cross_entropy)
  need_python
  xs="1 2 3   -1 0.5 4"
  run_in "$xs 2" op cross_entropy --shape 2x3 --targets 2,0 --backward
  expect_rc 0
  check_py $xs <<'PY'
z = [float(a) for a in args]
targets = [2, 0]
loss, dx = 0.0, []
for i in range(2):
    row = z[3 * i:3 * i + 3]
    lse = math.log(sum(math.exp(v) for v in row))
    loss += (lse - row[targets[i]]) / 2
    dx += [2 * (math.exp(v - lse) - (j == targets[i])) / 2 for j, v in enumerate(row)]
assert out["loss"][:2] == ("f32", [])
close(out["loss"][2], [loss], 1e-6, "loss")
close(out["dx"][2], dx, 1e-6, "dx with dloss 2")
PY
  ;;

softmax)
  need_python
  # Over the last dimension of a 2x2x3 input; --backward reads dy as y.
  xs="1 2 3   -1 0.5 4   100 101 102   0 0 0"
  dys="1 0 0   0.5 -1 2   1 1 1   3 -2 0.25"
  for op in softmax log_softmax; do
    run_in "$xs $dys" op $op --shape 2x2x3 --backward
    expect_rc 0
    check_py $op $xs $dys <<'PY'
op, v = args[0], [float(a) for a in args[1:]]
x, dy = v[:12], v[12:]
assert list(out) == ["y", "dx"], list(out)
assert out["y"][:2] == ("f32", [2, 2, 3]) and out["dx"][:2] == ("f32", [2, 2, 3])
def f(z):
    y = []
    for r in range(4):
        row = z[3 * r:3 * r + 3]
        m = max(row)
        lse = m + math.log(sum(math.exp(a - m) for a in row))
        y += [a - lse if op == "log_softmax" else math.exp(a - lse) for a in row]
    return y
close(out["y"][2], f(x), 1e-6, "y", 1e-7)
close(out["dx"][2], grad_fd(f, x, dy), 1e-5, "dx (central differences)", 1e-6)
PY
  done
  # f16 in, f16 out; the exponentials of ±60000 never overflow.
  run_in "60000 -60000 0" op softmax --shape 3 --dtype f16
  expect_rc 0
  check_py <<'PY'
assert out["y"][0] == "f16"
assert out["y"][2] == [1.0, 0.0, 0.0], out["y"][2]
PY
  ;;

cross_entropy_options)
  need_python
  xs="1 2 3   -1 0.5 4   2 2 2   0 7 -3"
  for red in mean sum none; do
    if [ "$red" = none ]; then dys="1 2 -1 0.5"; else dys="2"; fi
    run_in "$xs $dys" op cross_entropy --shape 4x3 --targets 2,-100,0,1 --label-smoothing 0.1 --reduction $red --backward
    expect_rc 0
    check_py $red $xs $dys <<'PY'
red, v = args[0], [float(a) for a in args[1:]]
z, dl = v[:12], v[12:]
t, eps = [2, -100, 0, 1], f32(0.1)
def rows(z):
    out = []
    for i in range(4):
        if t[i] == -100:
            out.append(0.0)
            continue
        row = z[3 * i:3 * i + 3]
        m = max(row)
        lse = m + math.log(sum(math.exp(a - m) for a in row))
        out.append((1 - eps) * (lse - row[t[i]]) + eps * (lse - sum(row) / 3))
    return out
def loss(z):
    r = rows(z)
    return r if red == "none" else [sum(r) / 3] if red == "mean" else [sum(r)]
want_shape = [4] if red == "none" else []
assert out["loss"][:2] == ("f32", want_shape), out["loss"][:2]
close(out["loss"][2], loss(z), 1e-6, "loss", 1e-7)
assert out["dx"][:2] == ("f32", [4, 3])
close(out["dx"][2], grad_fd(loss, z, dl), 1e-5, "dx (central differences)", 1e-6)
assert out["dx"][2][3:6] == [0.0, 0.0, 0.0], "the ignored row has no gradient"
PY
  done
  # Every target ignored: the mean is 0/0 = NaN, as PyTorch's.
  run_in "1 2 3 4" op cross_entropy --shape 2x2 --targets 1,1 --ignore-index 1
  expect_rc 0
  check_py <<'PY'
assert math.isnan(out["loss"][2][0]), out["loss"]
PY
  # f16 logits: an f32 loss, an f16 gradient.
  run_in "1 2 3 1" op cross_entropy --shape 1x3 --targets 0 --dtype f16 --backward
  expect_rc 0
  check_py <<'PY'
assert out["loss"][0] == "f32" and out["dx"][0] == "f16", (out["loss"][0], out["dx"][0])
PY
  ;;

attention)
  need_python
  # Causal self-attention of one sequence of 3 tokens, D = 2; --backward
  # reads dy in out's shape. The reference is written out in double, its
  # gradients by central differences.
  qs="1 0  0 1  1 1"
  ks="1 0  0 1  -1 1"
  vs="1 2  3 4  5 6"
  dys="1 -1  0.5 2  -3 0.25"
  run_in "$qs $ks $vs $dys" op scaled_dot_product_attention --shape 1x3x2 --is-causal true --backward
  expect_rc 0
  check_py $qs $ks $vs $dys <<'PY'
v = [float(a) for a in args]
q, k, vv, dy = v[0:6], v[6:12], v[12:18], v[18:24]
assert list(out) == ["out", "probs", "dq", "dk", "dv"], list(out)
assert out["out"][:2] == ("f32", [1, 3, 2]) and out["probs"][:2] == ("f32", [1, 3, 3])
def attend(q, k, vv):
    o, P = [], []
    for i in range(3):
        s = [(q[2 * i] * k[2 * j] + q[2 * i + 1] * k[2 * j + 1]) / math.sqrt(2) for j in range(i + 1)]
        m = max(s)
        e = [math.exp(t - m) for t in s]
        p = [t / sum(e) for t in e] + [0.0] * (2 - i)
        P += p
        o += [sum(p[j] * vv[2 * j + c] for j in range(3)) for c in range(2)]
    return o, P
o, P = attend(q, k, vv)
close(out["out"][2], o, 1e-6, "out", 1e-7)
close(out["probs"][2], P, 1e-6, "probs", 1e-7)
close(out["dq"][2], grad_fd(lambda t: attend(t, k, vv)[0], q, dy), 1e-5, "dq", 1e-6)
close(out["dk"][2], grad_fd(lambda t: attend(q, t, vv)[0], k, dy), 1e-5, "dk", 1e-6)
close(out["dv"][2], grad_fd(lambda t: attend(q, k, t)[0], vv, dy), 1e-5, "dv", 1e-6)
PY
  # fp16 with the scale after the product: Q K^T of 64 products of 40·40 is
  # past 65504, stored as inf; scaled first it is 12800.
  big=$(python3 -c 'print(" ".join(["40"] * 64 * 3))')
  run_in "$big" op scaled_dot_product_attention --shape 1x1x64 --dtype f16 --scale-after true
  expect_rc 0
  check_py <<'PY'
assert all(math.isnan(a) for a in out["out"][2]), out["out"][2][:4]
PY
  run_in "$big" op scaled_dot_product_attention --shape 1x1x64 --dtype f16
  expect_rc 0
  check_py <<'PY'
assert out["out"][2] == [40.0] * 64, out["out"][2][:4]
PY
  # Bad input: one line each, exit 2.
  run_in "1 2" op scaled_dot_product_attention --shape 2
  expect_usage_error "--shape 2: scaled_dot_product_attention takes q, k and v of one shape [N, L, D] or [B, H, L, D]"
  run_in "1 2 3 4 5 6" op scaled_dot_product_attention --shape 1x1x2 --is-causal yes
  expect_usage_error "--is-causal: 'yes' is not a choice; give true or false"
  run_in "1 2 3 4 5 6" op scaled_dot_product_attention --shape 1x1x2 --scale inf
  expect_usage_error "--scale: 'inf' is not a scale; give a finite number"
  run_in "1 2 3 4" op scaled_dot_product_attention --shape 1x1x2
  expect_usage_error "expected 6 numbers"
  ;;

nll_loss)
  need_python
  xs="-0.5 -1.5 -2   -0.25 -3 -1.75"
  run_in "$xs 4" op nll_loss --shape 2x3 --targets 1,2 --backward
  expect_rc 0
  check_py <<'PY'
assert list(out) == ["loss", "dx"]
close(out["loss"][2], [(1.5 + 1.75) / 2], 1e-7, "loss")
assert out["dx"][2] == [0.0, -2.0, 0.0, 0.0, 0.0, -2.0], out["dx"][2]
PY
  run_in "$xs" op nll_loss --shape 2x3 --targets 1,-100 --reduction none
  expect_rc 0
  check_py <<'PY'
assert out["loss"][1] == [2] and out["loss"][2] == [1.5, 0.0], out["loss"]
PY
  ;;

json)
  need_python
  input="1 -2 65520 1e-8 0.1 3   1 1 1 1 1 -0.5"
  run_in "$input" op relu --shape 2x3 --dtype f16 --backward
  expect_rc 0
  cp "$OUT" "$WORK/text"
  run_in "$input" op relu --shape 2x3 --dtype f16 --backward --json
  expect_rc 0
  python3 - "$OUT" "$WORK/text" <<'PY' || fail "the JSON does not hold what the text shows"
import json, math, struct, sys
j = json.load(open(sys.argv[1]))
assert list(j) == ["y", "dx"], list(j)
for name in j:
    assert list(j[name]) == ["dtype", "shape", "values"], j[name]
    assert j[name]["dtype"] == "f16" and j[name]["shape"] == [2, 3]
# inf is null; every other value is the text's, as the same float.
assert j["y"]["values"] == [1.0, 0.0, None, 0.0, j["y"]["values"][4], 3.0], j["y"]["values"]
vals = [v for l in open(sys.argv[2]) if l.startswith("  ") for v in l.split()]
got = j["y"]["values"] + j["dx"]["values"]
assert len(vals) == len(got) == 12, (vals, got)
for t, g in zip(vals, got):
    assert (g is None) == (t in ("inf", "-inf", "nan")), (t, g)
    if g is not None:
        f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]
        assert f32(g) == f32(float(t)), (t, g)
assert j["y"]["values"][4] == 0.099975586, j["y"]["values"][4]
assert j["dx"]["values"] == [1.0, 0.0, 1.0, 0.0, 1.0, -0.5], j["dx"]["values"]
PY
  # A loss is a scalar: shape [].
  run_in "1 2 3" op cross_entropy --shape 1x3 --targets 1 --json
  expect_rc 0
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["loss"]["shape"] == [] and len(j["loss"]["values"]) == 1, j' "$OUT" ||
    fail "the loss is not a scalar in the JSON"
  ;;

modes)
  need_python
  # batch_norm has modes: --train normalizes with the batch and updates the
  # running estimates, --eval normalizes with them and leaves them alone.
  run_in "1 2 3 4 5 6 7 8" op batch_norm --shape 4x2 --running-mean 1,2 --running-var 4,9 --eval
  expect_rc 0
  cp "$OUT" "$WORK/eval"
  run_in "1 2 3 4 5 6 7 8" op batch_norm --shape 4x2 --running-mean 1,2 --running-var 4,9
  cp "$OUT" "$WORK/default"
  run_in "1 2 3 4 5 6 7 8" op batch_norm --shape 4x2 --running-mean 1,2 --running-var 4,9 --train
  cmp -s "$WORK/default" "$OUT" || fail "the default mode should be --train"
  ! cmp -s "$WORK/eval" "$OUT" || fail "--eval and --train gave the same batch_norm"
  OUT=$WORK/eval check_py <<'PY'
assert list(out) == ["y", "running_mean", "running_var"], list(out)
y, _, _ = batch_norm([1, 2, 3, 4, 5, 6, 7, 8], [4, 2], 1e-5, [1, 1], [0, 0], [1, 2], [4, 9])
close(out["y"][2], y, 1e-6, "eval: normalized with the running estimates")
assert out["running_mean"][2] == [1, 2] and out["running_var"][2] == [4, 9]
PY
  # The other ops have no modes; --eval runs them unchanged.
  run_in "1 -1 2 -2" op relu --shape 4 --eval
  expect_rc 0
  cp "$OUT" "$WORK/eval"
  run_in "1 -1 2 -2" op relu --shape 4 --train
  cmp -s "$WORK/eval" "$OUT" || fail "--eval changed relu"
  run_in "1 -1 2 -2" op relu --shape 4 --train --eval
  expect_usage_error "--train and --eval exclude each other"
  run_in "1 2 3 4 5 6 7 8" op batch_norm --shape 4x2 --eval --train
  expect_usage_error "--train and --eval exclude each other"
  run op relu --help
  expect_out "ops with modes: batch_norm"
  ;;

batch_norm_train)
  need_python
  # N=3, C=2, L=2: six values per channel; momentum 0.2 from given estimates.
  xs="0.5 -1 2 3   1.5 0 -2 4   -0.5 1 0.25 -3"
  dys="1 -2 0.5 0.25   -1 3 2 -0.5   0.75 1 -1.5 2"
  run_in "$xs $dys" op batch_norm --shape 3x2x2 --momentum 0.2 --running-mean 0.5,-1 --running-var 2,0.25 --backward
  expect_rc 0
  check_py $xs $dys <<'PY'
v = [float(a) for a in args]
x, dy = v[:12], v[12:]
shape, eps = [3, 2, 2], 1e-5
assert list(out) == ["y", "mean", "invstd", "running_mean", "running_var", "dx", "dweight", "dbias"], list(out)
for name in out:
    assert out[name][0] == "f32", (name, out[name][0])
y, mean, var = batch_norm(x, shape, eps, [1, 1], [0, 0])
assert out["y"][1] == shape and out["mean"][1] == [2] and out["running_var"][1] == [2]
close(out["y"][2], y, 1e-5, "y", 1e-6)
close(out["mean"][2], mean, 1e-6, "batch mean", 1e-7)
close(out["invstd"][2], [1 / math.sqrt(s + eps) for s in var], 1e-6, "invstd: biased variance")
# The running variance takes the unbiased one: M / (M - 1) times the biased.
close(out["running_mean"][2], [0.8 * 0.5 + 0.2 * mean[0], 0.8 * -1 + 0.2 * mean[1]], 1e-6, "running mean")
close(out["running_var"][2], [0.8 * 2 + 0.2 * var[0] * 6 / 5, 0.8 * 0.25 + 0.2 * var[1] * 6 / 5], 1e-6,
      "running var")
f = lambda t: batch_norm(t, shape, eps, [1, 1], [0, 0])[0]
close(out["dx"][2], grad_fd(f, x, dy), 1e-4, "dx", 1e-5)
close(out["dweight"][2], grad_fd(lambda g: batch_norm(x, shape, eps, g, [0, 0])[0], [1, 1], dy), 1e-5,
      "dweight", 1e-6)
close(out["dbias"][2], grad_fd(lambda b: batch_norm(x, shape, eps, [1, 1], b)[0], [0, 0], dy), 1e-5,
      "dbias", 1e-6)
PY
  # momentum none: the cumulative average, after one batch the batch itself.
  run_in "$xs" op batch_norm --shape 3x2x2 --momentum none --running-mean 7,7
  expect_rc 0
  check_py $xs <<'PY'
x = [float(a) for a in args]
_, mean, var = batch_norm(x, [3, 2, 2], 1e-5, [1, 1], [0, 0])
close(out["running_mean"][2], mean, 1e-6, "cumulative mean", 1e-7)
close(out["running_var"][2], [s * 6 / 5 for s in var], 1e-6, "cumulative var")
PY
  # eps moves invstd.
  run_in "$xs" op batch_norm --shape 3x2x2 --eps 0.5
  check_py $xs <<'PY'
_, mean, var = batch_norm([float(a) for a in args], [3, 2, 2], 0.5, [1, 1], [0, 0])
close(out["invstd"][2], [1 / math.sqrt(s + 0.5) for s in var], 1e-6, "invstd with eps 0.5")
PY
  ;;

batch_norm_precision)
  need_python
  # Uniform f16: x and y f16, the statistics f32 (Welford in FP32), the
  # running estimates in the parameters' dtype, f16.
  xs="0.1 1000 0.2 1001 0.3 1002 0.4 1003"
  run_in "$xs" op batch_norm --shape 4x2 --dtype f16
  expect_rc 0
  check_py $xs <<'PY'
dt = {name: out[name][0] for name in out}
assert dt == {"y": "f16", "mean": "f32", "invstd": "f32", "running_mean": "f16", "running_var": "f16"}, dt
x = [f16(float(a)) for a in args]
y, mean, var = batch_norm(x, [4, 2], 1e-5, [1, 1], [0, 0])
close(out["mean"][2], mean, 1e-6, "mean of the f16 inputs")
close(out["y"][2], [f16(v) for v in y], 2 ** -10, "y rounded into f16", 2 ** -14)
assert out["running_mean"][2] == [f16(0.1 * m) for m in out["mean"][2]], out["running_mean"][2]
PY
  # keep-f32:batch_norm: the input (already f16) is cast up, y and the
  # running estimates are f32.
  run_in "$xs" op batch_norm --shape 4x2 --dtype f16 --policy keep-f32:batch_norm
  expect_rc 0
  check_py $xs <<'PY'
dt = {name: out[name][0] for name in out}
assert set(dt.values()) == {"f32"}, dt
x = [f16(float(a)) for a in args]
y, mean, var = batch_norm(x, [4, 2], 1e-5, [1, 1], [0, 0])
close(out["y"][2], y, 1e-5, "y in f32 from the f16 inputs", 1e-6)
PY
  ;;

layer_norm)
  need_python
  xs="1 2 3 4   0.5 -0.5 8 2   -3 1 1 0   2 2 2 2.5   7 -1 0 3   0.25 0.5 -4 1"
  dys="1 0 -1 2   0.5 0.5 -2 1   3 -1 0 0.25   1 1 -1 -1   0 2 1 -0.5   -1 0.75 1 2"
  run_in "$xs $dys" op layer_norm --shape 2x3x4 --backward
  expect_rc 0
  check_py $xs $dys <<'PY'
v = [float(a) for a in args]
x, dy = v[:24], v[24:]
assert list(out) == ["y", "mean", "rstd", "dx", "dweight", "dbias"], list(out)
assert out["y"][:2] == ("f32", [2, 3, 4]) and out["mean"][:2] == ("f32", [6])
assert out["dweight"][1] == [4]
ones, zeros = [1] * 4, [0] * 4
y, means, rstds = layer_norm(x, 4, 1e-5, ones, zeros)
close(out["y"][2], y, 1e-5, "y", 1e-6)
close(out["mean"][2], means, 1e-6, "mean", 1e-7)
close(out["rstd"][2], rstds, 1e-5, "rstd")
close(out["dx"][2], grad_fd(lambda t: layer_norm(t, 4, 1e-5, ones, zeros)[0], x, dy), 1e-4, "dx", 1e-5)
close(out["dweight"][2], grad_fd(lambda g: layer_norm(x, 4, 1e-5, g, zeros)[0], ones, dy), 1e-5, "dweight",
      1e-6)
close(out["dbias"][2], grad_fd(lambda b: layer_norm(x, 4, 1e-5, ones, b)[0], zeros, dy), 1e-5, "dbias", 1e-6)
PY
  # Over the last two dimensions: two rows of 12.
  run_in "$xs" op layer_norm --shape 2x3x4 --normalized-shape 3x4 --eps 0.01
  expect_rc 0
  check_py $xs <<'PY'
x = [float(a) for a in args]
y, means, rstds = layer_norm(x, 12, 0.01, [1] * 12, [0] * 12)
assert out["mean"][1] == [2]
close(out["y"][2], y, 1e-5, "y over 3x4", 1e-6)
close(out["rstd"][2], rstds, 1e-5, "rstd with eps 0.01")
PY
  ;;

conv2d)
  need_python
  # N=2, C=2, 4x5 images; 3 output channels, 3x3 kernel, stride 2, padding 1.
  xs=$(python3 -c 'print(" ".join(str((i * 7 % 11) / 4 - 1) for i in range(80)))')
  dys=$(python3 -c 'print(" ".join(str((i * 5 % 7) / 2 - 1.5) for i in range(36)))')
  run_in "$xs $dys" op conv2d --shape 2x2x4x5 --out-channels 3 --kernel-size 3 --stride 2 --padding 1 --seed 4 --backward
  expect_rc 0
  check_py $xs $dys <<'PY'
v = [float(a) for a in args]
x, dy = v[:80], v[80:]
assert list(out) == ["y", "weight", "bias", "dx", "dweight", "dbias"], list(out)
w, b = out["weight"][2], out["bias"][2]
assert out["weight"][1] == [3, 2, 3, 3] and out["bias"][1] == [3]
# The layer's own initialiser: uniform in +-1/sqrt(C k k).
assert all(abs(t) <= 1 / math.sqrt(18) for t in w + b) and len(set(w + b)) == 57
xs = [2, 2, 4, 5]
y, ys = conv2d(x, xs, w, b, 3, 3, 2, 1)
assert out["y"][1] == ys == [2, 3, 2, 3], out["y"][1]
close(out["y"][2], y, 1e-5, "y", 1e-6)
close(out["dx"][2], grad_fd(lambda t: conv2d(t, xs, w, b, 3, 3, 2, 1)[0], x, dy), 1e-5, "dx", 1e-5)
close(out["dweight"][2], grad_fd(lambda t: conv2d(x, xs, t, b, 3, 3, 2, 1)[0], w, dy), 1e-5, "dweight", 1e-5)
close(out["dbias"][2], grad_fd(lambda t: conv2d(x, xs, w, t, 3, 3, 2, 1)[0], b, dy), 1e-5, "dbias", 1e-5)
PY
  # Defaults: stride 1, padding 0.
  run_in "$xs" op conv2d --shape 2x2x4x5 --out-channels 1 --kernel-size 2
  expect_rc 0
  check_py $xs <<'PY'
x = [float(a) for a in args]
y, ys = conv2d(x, [2, 2, 4, 5], out["weight"][2], out["bias"][2], 1, 2, 1, 0)
assert out["y"][1] == ys == [2, 1, 3, 4]
close(out["y"][2], y, 1e-5, "y, stride 1, padding 0", 1e-6)
PY
  ;;

pooling)
  need_python
  # Distinct values, so every window has one maximum.
  xs=$(python3 -c 'print(" ".join(str((i * 13 % 32) - 10.5) for i in range(32)))')
  dys=$(python3 -c 'print(" ".join(str(i % 5 - 2 + 0.5 * (i % 3)) for i in range(32)))')
  for kind in max avg; do
    run_in "$xs" op ${kind}_pool2d --shape 1x2x4x4 --kernel-size 2
    expect_rc 0
    check_py $kind $xs <<'PY'
kind, x = args[0], [float(a) for a in args[1:]]
y, ys = pool2d(x, [1, 2, 4, 4], 2, 2, 0, kind)
assert list(out) == ["y"] and out["y"][1] == ys == [1, 2, 2, 2], out["y"][1]
close(out["y"][2], y, 1e-6, kind + " pool, stride = kernel size")
PY
    # Overlapping windows (stride 1) over padding 1: gradients add up.
    run_in "$xs $dys" op ${kind}_pool2d --shape 1x2x4x4 --kernel-size 3 --stride 1 --padding 1 --backward
    expect_rc 0
    check_py $kind $xs $dys <<'PY'
kind, v = args[0], [float(a) for a in args[1:]]
x, dy = v[:32], v[32:]
f = lambda t: pool2d(t, [1, 2, 4, 4], 3, 1, 1, kind)[0]
assert out["y"][1] == [1, 2, 4, 4] and out["dx"][1] == [1, 2, 4, 4]
close(out["y"][2], f(x), 1e-6, kind + " pool, padding 1")
close(out["dx"][2], grad_fd(f, x, dy, 1e-4), 1e-5, kind + " pool dx", 1e-6)
PY
  done
  ;;

bad_input)
  # Names.
  run op frobnicate
  expect_usage_error "unknown op 'frobnicate'" "runnable ops: $RUNNABLE_LIST"
  run op embedding
  expect_usage_error "'embedding' is a known op but not runnable from the command line yet"
  run op
  expect_usage_error "missing op name" "runnable ops:"
  run op relu --shape 2 --out-features 3
  expect_usage_error "unknown option '--out-features'" "--shape"
  run op list extra
  expect_usage_error "'extra'"
  run_in "1 2" op relu --shape 2 -- stray
  expect_usage_error "unexpected argument 'stray'" "stdin"
  # Shapes.
  run op relu
  expect_usage_error "missing --shape" "8x4x3x3"
  run op relu --shape 3x
  expect_usage_error "--shape: '3x' ends with x"
  run op relu --shape 2x0x3
  expect_usage_error "--shape: '2x0x3' is not a shape ('0' is no size)"
  run op relu --shape 2,3
  expect_usage_error "--shape: '2,3' is not a shape"
  run op relu --shape abc
  expect_usage_error "--shape: 'abc' is not a shape"
  run op relu --shape 100000x100000
  expect_usage_error "more than 16777216 elements"
  run op linear --shape 2x3x4 --out-features 2
  expect_usage_error "--shape 2x3x4: linear takes x [B, in], 2 dimensions; this shape has 3"
  run op cross_entropy --shape 6 --targets 1
  expect_usage_error "cross_entropy takes logits x [B, C], 2 dimensions; this shape has 1"
  # Counts and numbers.
  run_in "1 2 3 4 5" op relu --shape 2x3
  expect_usage_error "stdin: expected 6 numbers, 6 for x (2x3); got 5"
  run_in "1 2 3 4 5 6 7" op relu --shape 2x3
  expect_usage_error "stdin: expected 6 numbers, 6 for x (2x3); got 7"
  run op relu --shape 2
  expect_usage_error "stdin: expected 2 numbers, 2 for x (2); got 0"
  run_in "1 2 3 4 5 6 7" op linear --shape 2x3 --out-features 2 --backward
  expect_usage_error "stdin: expected 10 numbers, 6 for x (2x3), then 4 for dy (2x2); got 7"
  run_in "1 2 3 4 5 6 7 8 9 10 11" op linear --shape 2x3 --out-features 2 --backward
  expect_usage_error "stdin: expected 10 numbers, 6 for x (2x3), then 4 for dy (2x2); got 11"
  run_in "1 2 3" op relu --shape 2x3 --backward
  expect_usage_error "stdin: expected at least 6 numbers, 6 for x (2x3), then dy" "got 3"
  run_in "1 2 3 4 5 6" op mse_loss --shape 2x3
  expect_usage_error "stdin: expected 12 numbers, 6 for x (2x3), then 6 for target (2x3); got 6"
  run_in "1 2 3 4 5 6 7 8" op mse_loss --shape 2x2 --backward
  expect_usage_error "stdin: expected 9 numbers, 4 for x (2x2), then 4 for target (2x2), then 1 for dy (scalar); got 8"
  run_in "1 2 zwei 4" op relu --shape 4
  expect_usage_error "stdin: cannot parse 'zwei' (input 3) as a number"
  run_in "1 2 3 4 5 6 1e" op linear --shape 2x3 --out-features 1 --backward
  expect_usage_error "cannot parse '1e' (input 7)"
  # Options.
  run op relu --shape 2 --dtype fp8
  expect_usage_error "--dtype: unknown dtype 'fp8'" "f32, bf16, f16, e4m3, e5m2"
  run op relu --shape 2 --policy amp
  expect_usage_error "--policy: policy 'amp': unknown dtype 'amp', and no named policy" "keep-f32:OP[,OP...]"
  run op relu --shape 2 --policy keep-f32:rleu
  expect_usage_error "--policy: policy 'f32+keep-f32:rleu': unknown op 'rleu'; known ops: linear, matmul"
  run op relu --shape 2 --policy keep-f32:
  expect_usage_error "--policy: policy 'f32+keep-f32:': 'keep-f32:' names nothing" "valid: BASE[+keep-f32:OP"
  run op relu --shape 2 --policy keep-f32:relu,
  expect_usage_error "'keep-f32:' has an empty name (a comma too many)"
  run op relu --shape 2 --dtype f16 --policy keep-f32:relu,relu
  expect_usage_error "'relu' is named twice"
  run op linear --shape 2x3
  expect_usage_error "missing --out-features" "--out-features 4"
  run op linear --shape 2x3 --out-features 0
  expect_usage_error "--out-features: '0' is not the number of output features" "from 1 to 65536"
  run op linear --shape 2x3 --out-features 2 --seed -1
  expect_usage_error "--seed: '-1' is not a seed"
  run op gelu --shape 2 --approximate sigmoid
  expect_usage_error "--approximate: unknown approximation 'sigmoid'; valid: none, tanh"
  run op cross_entropy --shape 2x3
  expect_usage_error "missing --targets" "from 0 to 2"
  run op cross_entropy --shape 2x3 --targets 1
  expect_usage_error "--targets: 1 class id(s) for 2 row(s)"
  run op cross_entropy --shape 2x3 --targets 1,3
  expect_usage_error "--targets: '3' is not a class of x" "from 0 to 2"
  run op cross_entropy --shape 2x3 --targets 1,
  expect_usage_error "--targets: '1,' ends with a comma"
  run op cross_entropy --shape 2x3 --targets 1,-100 --ignore-index -1
  expect_usage_error "--targets: '-100' is not a class of x" "or the --ignore-index -1"
  run op cross_entropy --shape 2x3 --targets 1,0 --ignore-index x
  expect_usage_error "--ignore-index: 'x' is not a class id to ignore"
  run op cross_entropy --shape 2x3 --targets 1,0 --label-smoothing 1.5
  expect_usage_error "--label-smoothing: '1.5' is not a label smoothing; give a number from 0 to 1"
  run op cross_entropy --shape 2x3 --targets 1,0 --reduction avg
  expect_usage_error "--reduction: unknown reduction 'avg'; valid: mean, sum, none"
  run_in "1 2 3 4 5 6 1" op cross_entropy --shape 2x3 --targets 1,0 --reduction none --backward
  expect_usage_error "stdin: expected 8 numbers, 6 for x (2x3), then 2 for dy (2); got 7"
  run op nll_loss --shape 6 --targets 1
  expect_usage_error "nll_loss takes log-probabilities x [B, C], 2 dimensions; this shape has 1"
  run op nll_loss --shape 2x3 --targets 1,3
  expect_usage_error "--targets: '3' is not a class of x" "from 0 to 2"
  run_in "1 2 3" op softmax --shape 3 --backward
  expect_usage_error "stdin: expected 6 numbers, 3 for x (3), then 3 for dy (3); got 3"
  run op conv2d --shape 2x3 --out-channels 1 --kernel-size 1
  expect_usage_error "conv2d takes x [N, C, H, W], 4 dimensions; this shape has 2"
  run op conv2d --shape 1x1x4x4 --out-channels 1
  expect_usage_error "missing --kernel-size" "--kernel-size 3"
  run op conv2d --shape 1x1x4x4 --kernel-size 3
  expect_usage_error "missing --out-channels"
  run op conv2d --shape 1x1x4x4 --out-channels 1 --kernel-size 3 --stride 0
  expect_usage_error "--stride: '0' is not the window's step" "from 1 to 1024"
  run_in "$(seq 16)" op conv2d --shape 1x1x4x4 --out-channels 1 --kernel-size 5
  expect_usage_error "Conv2d"
  run op max_pool2d --shape 1x1x4x4 --kernel-size 2 --padding 2
  expect_usage_error "padding must be in 0..1"
  run op avg_pool2d --shape 1x4x4 --kernel-size 2
  expect_usage_error "avg_pool2d takes x [N, C, H, W]"
  run op batch_norm --shape 2x2x2x2x2
  expect_usage_error "batch_norm takes x [N, C], [N, C, L] or [N, C, H, W]; this shape has 5"
  run op batch_norm --shape 4x3 --running-mean 1,2
  expect_usage_error "--running-mean: 2 number(s); give 3 number(s) separated by commas"
  run op batch_norm --shape 4x3 --running-var 1,x,2
  expect_usage_error "--running-var: cannot parse 'x'"
  run op batch_norm --shape 4x3 --momentum 1.5
  expect_usage_error "--momentum: '1.5' is not a momentum" "none"
  run op batch_norm --shape 4x3 --eps -1
  expect_usage_error "--eps: '-1' is not an eps"
  run op layer_norm --shape 4x3 --eps abc
  expect_usage_error "--eps: cannot parse 'abc'"
  run op layer_norm --shape 2x3x4 --normalized-shape 2x4
  expect_usage_error "--normalized-shape 2x4" "does not end with these"
  run op layer_norm --shape 2x3 --normalized-shape 0
  expect_usage_error "--normalized-shape: '0' is not a shape"
  # A channel of one value cannot be normalized with batch statistics
  # (training); eval can.
  run_in "1 2" op batch_norm --shape 1x2
  expect_usage_error "expected more than 1 value per channel when training"
  run_in "1 2" op batch_norm --shape 1x2 --eval
  expect_rc 0
  ;;

help_documents_choices)
  # The decisions a user must know are in the help texts.
  run op --help
  expect_rc 0
  expect_out "rounded (RNE) into --dtype"
  expect_out "inf and NaN as null"
  run op cross_entropy --help
  expect_rc 0
  expect_out "--targets IDS"
  expect_out "class id of each row"
  run op linear --help
  expect_out "--seed S=0"
  expect_out "keep-f32:OP[,OP...]"
  expect_out "ops without modes run the same in both"
  ;;

*)
  echo "unknown case '$CASE'"
  exit 2
  ;;
esac
exit 0
