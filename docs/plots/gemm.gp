# written by distlab-bench; render with: gnuplot ../docs/plots/gemm.gp
set terminal svg size 900,540 dynamic
set output '../docs/plots/gemm.svg'
datafile = '../docs/plots/gemm.dat'
set grid
set key outside right
set title 'distlab-bench gemm: per-rank GEMM throughput'
set xlabel 'ranks running at once'
set ylabel 'GFLOP/s per rank'
set y2label 'contention (alone / together)'
set y2tics
set ytics nomirror
set yrange [0:*]
set y2range [0:*]
set xtics 1
plot datafile using 1:2 with linespoints title 'GFLOP/s per rank', \
     datafile using 1:3 axes x1y2 with linespoints title 'contention'
