# written by distlab-bench; render with: gnuplot docs/plots/scaling.gp
set terminal svg size 900,540 dynamic
set output 'docs/plots/scaling.svg'
datafile = 'docs/plots/scaling.dat'
set grid
set key outside right
set multiplot layout 1,2 title 'distlab-bench scaling: the trainer (rank threads on this machine)'
set logscale x 2
set xrange [0.9:*]
set offsets 0, graph 0.05, 0, 0
set xlabel 'ranks'
set ylabel 'speed-up over one rank'
set yrange [0:*]
COL = 2
unset key
plot datafile index 0 using 1:(column(COL)) with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'strong dp', datafile index 1 using 1:(column(COL)) with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'weak dp', datafile index 2 using 1:(column(COL)) with linespoints lw 2 pt 7 lc rgb '#d62728' title 'strong tp', datafile index 3 using 1:(column(COL)) with linespoints lw 2 pt 7 lc rgb '#9467bd' title 'strong pp', for [i=0:3] datafile index i using 1:($4 > 0 ? column(COL) : 1/0) with points pt 6 ps 2.2 lc rgb 'black' title (i == 0 ? 'oversubscribed' : ''), x with lines dt 2 lc rgb 'grey50' notitle
set ylabel 'efficiency (speed-up / ranks)'
set yrange [0:1.1]
COL = 3
set key inside bottom left box opaque font ',10'
plot datafile index 0 using 1:(column(COL)) with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'strong dp', datafile index 1 using 1:(column(COL)) with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'weak dp', datafile index 2 using 1:(column(COL)) with linespoints lw 2 pt 7 lc rgb '#d62728' title 'strong tp', datafile index 3 using 1:(column(COL)) with linespoints lw 2 pt 7 lc rgb '#9467bd' title 'strong pp', for [i=0:3] datafile index i using 1:($4 > 0 ? column(COL) : 1/0) with points pt 6 ps 2.2 lc rgb 'black' title (i == 0 ? 'oversubscribed' : ''), 1 with lines dt 2 lc rgb 'grey50' title 'ideal'
unset multiplot
