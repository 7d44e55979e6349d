"""Quality: graders decide whether an answer passes; gates decide whether two configurations are comparable."""
