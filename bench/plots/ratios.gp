# ratios.gp - one bar per path: its figure over its reference's, measured in the same run (1 = the
# reference, which is the most that path can do). bench/report.py plots sets data, out and n.
set terminal svg size 1000, 120 + 16 * n font "sans,10" noenhanced
set output out
set datafile separator "\t"
set style fill solid 0.6 noborder
set key off
set yrange [n:-1]
set ytics scale 0 font "sans,9"
set xrange [0:*]
set grid xtics
set arrow from 1, graph 0 to 1, graph 1 nohead dashtype 2
set xlabel "figure / reference (same run)"
set title "Each path against its reference, measured in the same run"
set lmargin 52
plot data using 2:0:(0):2:($0 - 0.35):($0 + 0.35):ytic(1) with boxxyerror
