# A shell script that forks: 2,000 subshells and 2,000 command
# substitutions, each a fork of bash and its exit. What the allocator adds
# to a fork (its threads, its mappings, its fork handlers) shows here.
for i in $(seq 2000); do
  ( : )
  x=$(echo "$i")
done
