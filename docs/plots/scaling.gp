# written by distlab-bench; render with: gnuplot ../docs/plots/scaling.gp
set terminal svg size 900,540 dynamic
set output '../docs/plots/scaling.svg'
datafile = '../docs/plots/scaling.dat'
set grid
set key outside right
set title 'distlab-bench scaling: the trainer'
set xlabel 'ranks'
set ylabel 'speed-up over one rank'
set y2label 'efficiency'
set y2tics
set yrange [0:*]
set y2range [0:1.1]
set logscale x 2
plot datafile index 0 using 1:2 with linespoints title 'strong dp', \
     datafile index 1 using 1:2 with linespoints title 'weak dp', \
     datafile index 2 using 1:2 with linespoints title 'strong tp', \
     datafile index 0 using 1:3 axes x1y2 with lines dt 2 title 'eff. strong dp', \
     datafile index 1 using 1:3 axes x1y2 with lines dt 2 title 'eff. weak dp', \
     datafile index 2 using 1:3 axes x1y2 with lines dt 2 title 'eff. strong tp'
