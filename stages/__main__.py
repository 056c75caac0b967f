"""python -m stages: the benchmark ladder (stages/bench/ladder.py); python -m stages tour: the interview
walkthrough (stages/tour.py)."""
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["tour"]:
        from stages.tour import main as tour
        return tour(argv[1:])
    from stages.bench.ladder import main as ladder
    return ladder(argv)


if __name__ == "__main__":
    main()
