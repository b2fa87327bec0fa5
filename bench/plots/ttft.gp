# ttft.gp - mean TTFT per setting of the mini engine: recomputing every prompt (no connector), with
# the connector loading its hits, and with its best plan or tier chain. bench/report.py plots sets
# data, out and n.
set terminal svg size 1000, 160 + 22 * n font "sans,10" noenhanced
set output out
set datafile separator "\t"
set datafile missing "NaN"
set style fill solid 0.7 noborder
set key outside top center horizontal font "sans,9"
set yrange [n:-1]
set ytics scale 0 font "sans,9"
set xrange [0:*]
set grid xtics
set xlabel "mean TTFT of the turns after the first (ms)"
set title "Mean TTFT with and without the connector"
set lmargin 46
w = 0.26
plot data using 2:0:(0):2:($0 - 0.39):($0 - 0.39 + w):ytic(1) with boxxyerror title "without connector (recompute)", \
     data using 3:0:(0):3:($0 - 0.13):($0 - 0.13 + w) with boxxyerror title "with connector (loads)", \
     data using 4:0:(0):4:($0 + 0.13):($0 + 0.13 + w) with boxxyerror title "with connector (best plan or chain)"
