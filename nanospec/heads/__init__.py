"""The draft heads: EAGLE-1/2 (`head`), EAGLE-3 (`head3`) with its three target features and pruned
draft vocabulary, and the fp32 guard both keep their rotary tables under."""
