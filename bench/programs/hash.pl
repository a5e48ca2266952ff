# bench/programs/hash.pl: Perl hash and string churn for the programs set of
# bench/run: 400k keys holding small arrays and strings of 0-49 bytes, then
# a pass that deletes a third of them.
use strict;
use warnings;
my %h;
for my $i (1 .. 400000) { $h{"k$i"} = [$i, "v" x ($i % 50)]; }
my $n = 0;
for my $k (keys %h) {
    $n += length($h{$k}[1]);
    delete $h{$k} if $n % 3 == 0;
}
print scalar(keys %h), " $n\n";
