# written by distlab-bench; render with: gnuplot ../docs/plots/overlap.gp
set terminal svg size 900,540 dynamic
set output '../docs/plots/overlap.svg'
datafile = '../docs/plots/overlap.dat'
set grid
set key outside right
set title 'distlab-bench overlap: all-reduce vs GEMMs'
set logscale x 2
set xlabel 'all-reduce bytes'
set format x '%.0b%B'
set ylabel 'fraction hidden'
set yrange [0:1.05]
set y2label 'slowdown (x)'
set y2tics
set ytics nomirror
set y2range [0:*]
plot datafile using 1:2 with linespoints title 'hidden (thread)', \
     datafile using 1:5 with linespoints title 'hidden (alternating)', \
     datafile using 1:3 axes x1y2 with linespoints title 'comm slowdown', \
     datafile using 1:4 axes x1y2 with linespoints title 'GEMM slowdown'
