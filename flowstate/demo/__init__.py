"""Built-in demos: the hotel case of the paper's Figure 1."""
