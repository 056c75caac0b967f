"""python -m stages: the benchmark ladder (stages/bench/ladder.py)."""
from stages.bench.ladder import main

if __name__ == "__main__":
    main()
