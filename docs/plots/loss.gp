# written by distlab-train; render with: gnuplot loss.gp
set terminal svg size 900,540 dynamic
set output 'loss.svg'
datafile = 'loss.dat'
set grid
set key outside right
set title "distlab-train: loss against step (dp 2 x tp 1 x pp 1, f32, 300 steps)"
set key inside top right
set xlabel 'step'
set ylabel 'loss (nats per byte)'
plot datafile index 0 using 1:2 with lines lw 2 title 'training loss', \
     datafile index 1 using 1:2 with linespoints pt 7 title 'validation loss', \
     1.21300757 with lines dt 2 title "the corpus's entropy rate (the floor)"
