"""python -m stages: the benchmark ladder (stages/bench/ladder.py); python -m stages tour: the interview
walkthrough (stages/tour.py)."""
import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["tour"]:
        from stages.tour import main as tour
        tour(sys.argv[2:])
    else:
        from stages.bench.ladder import main
        main()
