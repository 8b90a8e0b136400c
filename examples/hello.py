"""The first levers9 app: start levers9 with `levers9 up`, then `levers9 run examples/hello.py`.

`square` asks for an H100 and falls back to the CPU when no pool offers one,
so it runs on a laptop with no GPU; `map` runs one call per input on the
local pool's workers and gives the results back in order.
"""

import platform

import levers9


@levers9.function(gpu=["H100", "cpu"], cpu=0.25, memory=256)
def square(x: int) -> int:
    return x * x


@levers9.function()
def where() -> str:
    return f"{platform.node()} (Python {platform.python_version()})"


if __name__ == "__main__":
    print("hello from", where.remote())
    print("7 squared on a levers9 worker:", square.remote(7))
    print("squares of 0..9:", list(square.map(range(10))))
