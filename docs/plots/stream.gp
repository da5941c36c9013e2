# written by distlab-bench; render with: gnuplot ../docs/plots/stream.gp
set terminal svg size 900,540 dynamic
set output '../docs/plots/stream.svg'
datafile = '../docs/plots/stream.dat'
set grid
set key outside right
set title 'distlab-bench stream: memory bandwidth'
set xlabel 'threads'
set ylabel 'GB/s (all threads)'
set yrange [0:*]
set xtics 1
plot datafile index 0 using 1:2 with linespoints title 'copy, compact', \
     datafile index 0 using 1:3 with linespoints title 'triad, compact', \
     datafile index 1 using 1:2 with linespoints title 'copy, scatter', \
     datafile index 1 using 1:3 with linespoints title 'triad, scatter'
