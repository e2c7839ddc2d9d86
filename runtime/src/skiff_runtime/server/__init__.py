"""gRPC adapters: the inference servicer, health checking, error mapping and the process that runs them."""
