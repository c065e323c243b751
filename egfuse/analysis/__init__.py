"""What the graph's values are known to be, by abstract evaluation: symbolic shapes and dims, small constants, shape
vectors, finiteness and magnitude bounds, stored weights summarised: the facts the rules ask for."""
